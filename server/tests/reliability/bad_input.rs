//! Bad input, over HTTP, on every backend, with the stores
//! checked afterwards. The server's own suite (tests/http) checks the answer
//! to some of these; this table adds the rest (non-ASCII and control
//! characters, wrong types, unknown service, wrong content type, another
//! path, other schemes) and checks what no answer can show: that nothing
//! was left in the record store, nothing was bought, no label was written.
//! Then random bytes as keys and bodies: never a 500.

use crate::support::backends::BackendSetup;
use crate::support::service::{Service, ServiceOptions};
use crate::support::{ALICE, ALICE_ID, LabelPost, client, derived_key, label_body, scaled, seed, unique_order_id};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use server::backend::StoreKind;
use server::labels::BODY_BYTES_MAX;
use store_core::{CallerId, IdempotencyKey, RecordState};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Random inputs per backend when `IDEM_FUZZ_REQUESTS` is not set.
pub const FUZZ_REQUESTS_CI_DEFAULT: usize = 300;

/// One bad request and the answer it must get.
struct Case {
    name: &'static str,
    post: LabelPost<'static>,
    status: u16,
    code: &'static str,
}

fn case(name: &'static str, status: u16, code: &'static str, edit: impl FnOnce(&mut LabelPost<'static>)) -> Case {
    let order_id = unique_order_id();
    let key: &'static str = Box::leak(derived_key(order_id, 1).into_boxed_str());
    let mut post = LabelPost::new(key, &label_body(order_id, 1));
    edit(&mut post);
    Case {
        name,
        post,
        status,
        code,
    }
}

fn body(text: &str) -> Vec<u8> {
    text.as_bytes().to_vec()
}

fn cases() -> Vec<Case> {
    let long_key: &'static [u8] = Box::leak("k".repeat(256).into_bytes().into_boxed_slice());
    let oversized = format!(
        r#"{{"order_id":1,"parcel_no":1,"weight_g":1,"service":"ground","pad":"{}"}}"#,
        "x".repeat(BODY_BYTES_MAX)
    );
    let key_invalid = "idempotency_key_invalid";
    vec![
        case("missing key", 400, "idempotency_key_missing", |p| p.key = None),
        case("empty key", 400, key_invalid, |p| p.key = Some(b"")),
        case("256-character key", 400, key_invalid, |p| p.key = Some(long_key)),
        case("non-ASCII key", 400, key_invalid, |p| {
            p.key = Some("clé:918273".as_bytes())
        }),
        case("tab inside the key", 400, key_invalid, |p| p.key = Some(b"label:\t1")),
        case("unterminated quoted key", 400, key_invalid, |p| {
            p.key = Some(b"\"label:1")
        }),
        case("bad escape in a quoted key", 400, key_invalid, |p| {
            p.key = Some(br#""a\nb""#)
        }),
        case("parameters after a quoted key", 400, key_invalid, |p| {
            p.key = Some(br#""abc";p=1"#)
        }),
        case("empty quoted key", 400, key_invalid, |p| p.key = Some(b"\"\"")),
        case("no bearer token", 401, "unauthorized", |p| p.token = None),
        case("unknown bearer token", 401, "unauthorized", |p| {
            p.token = Some("not-a-token")
        }),
        case("malformed JSON", 400, "invalid_request", |p| {
            p.body = body(r#"{"order_id":"#)
        }),
        case("empty body", 400, "invalid_request", |p| p.body = Vec::new()),
        case("weight as a string", 400, "invalid_request", |p| {
            p.body = body(r#"{"order_id":1,"parcel_no":1,"weight_g":"heavy","service":"ground"}"#)
        }),
        case("fractional parcel number", 400, "invalid_request", |p| {
            p.body = body(r#"{"order_id":1,"parcel_no":1.5,"weight_g":1,"service":"ground"}"#)
        }),
        case("negative order id", 400, "invalid_request", |p| {
            p.body = body(r#"{"order_id":-1,"parcel_no":1,"weight_g":1,"service":"ground"}"#)
        }),
        case("weight 0 g", 400, "invalid_request", |p| {
            p.body = body(r#"{"order_id":1,"parcel_no":1,"weight_g":0,"service":"ground"}"#)
        }),
        case("weight 70,001 g", 400, "invalid_request", |p| {
            p.body = body(r#"{"order_id":1,"parcel_no":1,"weight_g":70001,"service":"ground"}"#)
        }),
        case("unknown service", 400, "invalid_request", |p| {
            p.body = body(r#"{"order_id":1,"parcel_no":1,"weight_g":1,"service":"air"}"#)
        }),
        case("a JSON array", 400, "invalid_request", |p| p.body = body("[1,2,3]")),
        case("XML under an XML content type", 415, "unsupported_media_type", |p| {
            p.content_type = Some("application/xml");
            p.body = body("<label><order_id>1</order_id></label>");
        }),
        case("valid JSON declared text/plain", 415, "unsupported_media_type", |p| {
            p.content_type = Some("text/plain")
        }),
        case("valid JSON with no Content-Type", 415, "unsupported_media_type", |p| {
            p.content_type = None
        }),
        case("body over the limit", 413, "payload_too_large", |p| {
            p.body = oversized.into_bytes()
        }),
        case("the same body on another path", 404, "not_found", |p| {
            p.path = "/v1/label"
        }),
        // Matches GET /v1/labels/{label_id}.
        case("the same body on a sub-path", 405, "method_not_allowed", |p| {
            p.path = "/v1/labels/new"
        }),
    ]
}

async fn bad_input(backend: StoreKind) {
    let setup = BackendSetup::start(backend).await;
    let service = Service::start(&setup, ServiceOptions::default()).await;
    let http = client();

    // The 422 case needs a completed key first.
    let order_id = unique_order_id();
    let key = derived_key(order_id, 1);
    let first = LabelPost::new(&key, &label_body(order_id, 1))
        .send(&http, &service.base)
        .await
        .expect("answer");
    assert_eq!(first.status, 201);
    let rows_before = service.record_store_rows(&setup).await;
    let labels_before = service.census().await.labels_total();

    let reused = LabelPost::new(&key, &label_body(order_id, 2))
        .send(&http, &service.base)
        .await
        .expect("answer");
    assert_eq!((reused.status, reused.code().as_str()), (422, "idempotency_key_reused"));
    let record = service
        .records
        .inspect(
            &CallerId::new(ALICE_ID).expect("caller"),
            &IdempotencyKey::new(&key).expect("key"),
        )
        .await
        .expect("inspect")
        .expect("the record is still there");
    match record.state {
        RecordState::Completed { response, .. } => assert_eq!(response.body(), first.body.as_slice()),
        other => panic!("the 422 changed the record: {other:?}"),
    }

    for case in cases() {
        let reply = case.post.send(&http, &service.base).await.expect("an answer");
        assert_eq!(
            (reply.status, reply.code().as_str()),
            (case.status, case.code),
            "{backend:?}, {}: {}",
            case.name,
            reply.text()
        );
        assert_eq!(
            reply.header("content-type"),
            Some("application/problem+json"),
            "{backend:?}, {}",
            case.name
        );
    }
    for raw_key in ["label:\x01:1", "label:\x7f:1"] {
        let status = raw_request_status(&service.base, raw_key).await;
        assert_eq!(
            status, 400,
            "{backend:?}: a control character in the key must be refused"
        );
    }
    let stats = service.carrier_stats(&http).await;
    assert_eq!(
        stats.requests_total, 1,
        "only the first, valid request reached the carrier"
    );
    assert_eq!(
        service.record_store_rows(&setup).await,
        rows_before,
        "{backend:?}: bad input left records"
    );
    assert_eq!(
        service.census().await.labels_total(),
        labels_before,
        "{backend:?}: bad input left labels"
    );
    eprintln!(
        "RELIABILITY bad_input backend={} cases={} leftovers=0 purchases=0",
        backend.name(),
        cases().len() + 3,
    );
}

/// A request whose key has a byte no HTTP client library will send.
async fn raw_request_status(base: &str, key: &str) -> u16 {
    let address = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address).await.expect("connect");
    let body = label_body(unique_order_id(), 1);
    let request = format!(
        "POST /v1/labels HTTP/1.1\r\nhost: {address}\r\nauthorization: Bearer {ALICE}\r\n\
         idempotency-key: {key}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|status| status.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP status in {answer:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_and_leaves_nothing_behind_embedded() {
    bad_input(StoreKind::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_and_leaves_nothing_behind_redis() {
    bad_input(StoreKind::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_and_leaves_nothing_behind_postgres() {
    bad_input(StoreKind::Postgres).await;
}

/// Bytes a header value may carry (visible ASCII, space, tab, obs-text).
fn header_bytes(rng: &mut StdRng) -> Vec<u8> {
    let length = rng.random_range(0..300);
    (0..length)
        .map(|_| {
            loop {
                let byte: u8 = rng.random();
                if byte == b'\t' || (0x20..=0x7e).contains(&byte) || byte >= 0x80 {
                    break byte;
                }
            }
        })
        .collect()
}

fn random_body(rng: &mut StdRng) -> Vec<u8> {
    let fragments = [
        "{",
        "}",
        "[",
        "]",
        "\"order_id\"",
        "\"parcel_no\"",
        "\"weight_g\"",
        "\"service\"",
        ":",
        ",",
        "1",
        "-1",
        "70000",
        "1e400",
        "\"ground\"",
        "\"air\"",
        "null",
        "true",
        "\"\\u0000\"",
        "\u{10ffff}",
        " ",
    ];
    let parts = rng.random_range(0..40);
    let mut body = Vec::new();
    for _ in 0..parts {
        if rng.random_bool(0.1) {
            body.push(rng.random());
        } else {
            body.extend_from_slice(fragments[rng.random_range(0..fragments.len())].as_bytes());
        }
    }
    body
}

/// Random keys and bodies: every answer is a 2xx or 4xx, never a 5xx.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_keys_and_bodies_never_get_a_server_error() {
    let requests = scaled("IDEM_FUZZ_REQUESTS", FUZZ_REQUESTS_CI_DEFAULT);
    let mut rng = StdRng::seed_from_u64(seed("bad_input_fuzz"));
    let setup = BackendSetup::start(StoreKind::Embedded).await;
    let service = Service::start(&setup, ServiceOptions::default()).await;
    let http = client();
    let mut by_status = std::collections::BTreeMap::new();
    for _ in 0..requests {
        // Half the keys are valid, so bodies reach the route too.
        let key = if rng.random_bool(0.5) {
            format!("fuzz:{:016x}", rng.random::<u64>()).into_bytes()
        } else {
            header_bytes(&mut rng)
        };
        let post = LabelPost {
            key: Some(&key),
            body: random_body(&mut rng),
            ..LabelPost::new("unused", "")
        };
        let reply = post.send(&http, &service.base).await.expect("an answer");
        assert!(
            reply.status < 500,
            "{} for key {key:?} body {:?}: {}",
            reply.status,
            post.body,
            reply.text()
        );
        *by_status.entry(reply.status).or_insert(0) += 1;
    }
    eprintln!("RELIABILITY fuzz_http requests={requests} by_status={by_status:?}");
}
