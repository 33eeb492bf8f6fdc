//! What the router refuses before any store is touched: a body not declared
//! JSON (415) and a method a path does not serve (405), both as problem
//! details, leaving the key free.

use crate::common::{ALICE, Reply, TestServer, client, fresh_key, label_body, order_id, read_documented};
use server::backend::StoreKind;

async fn post_label_as(server: &TestServer, content_type: Option<&str>, key: &str, body: &str) -> Reply {
    let mut request = client()
        .post(format!("{}/v1/labels", server.base))
        .bearer_auth(ALICE)
        .header("idempotency-key", key)
        .body(body.to_owned());
    if let Some(content_type) = content_type {
        request = request.header("content-type", content_type);
    }
    read_documented("POST", "/v1/labels", request.send().await.expect("server answers")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_not_declared_json_is_415_and_the_key_stays_free() {
    let server = TestServer::start(StoreKind::Embedded).await;
    let (key, body) = (fresh_key(), label_body(order_id(), 1));
    for content_type in [Some("text/plain"), Some("application/x-www-form-urlencoded"), None] {
        let refused = post_label_as(&server, content_type, &key, &body).await;
        assert_eq!(
            (refused.status, refused.problem_code().as_str()),
            (415, "unsupported_media_type"),
            "{content_type:?}"
        );
    }
    let accepted = post_label_as(&server, Some("application/json; charset=utf-8"), &key, &body).await;
    assert_eq!(accepted.status, 201, "the key was never claimed: {}", accepted.text());
    assert_eq!(accepted.header("idempotent-replayed"), None);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_method_a_path_does_not_serve_is_405_with_allow() {
    let server = TestServer::start(StoreKind::Embedded).await;
    for (method, path, allowed) in [
        (reqwest::Method::POST, "/v1/labels/new", "GET,HEAD"),
        (reqwest::Method::GET, "/v1/labels", "POST"),
        (reqwest::Method::DELETE, "/healthz", "GET,HEAD"),
    ] {
        let response = client()
            .request(method.clone(), format!("{}{path}", server.base))
            .bearer_auth(ALICE)
            .send()
            .await
            .expect("server answers");
        assert_eq!(response.status(), 405, "{method} {path}");
        let header = |name: &str| response.headers()[name].to_str().unwrap().to_owned();
        assert_eq!(header("allow"), allowed, "{method} {path}");
        assert_eq!(header("content-type"), "application/problem+json", "{method} {path}");
        let problem: serde_json::Value = response.json().await.expect("a problem body");
        assert_eq!(problem["code"], "method_not_allowed", "{method} {path}");
    }
    server.shutdown().await;
}
