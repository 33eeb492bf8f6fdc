//! What every reliability test shares: the callers, an HTTP client whose
//! answers are read whole, label bodies, the scale knobs, and the backends.

pub mod audit;
pub mod backends;
pub mod process;
pub mod service;

use serde_json::Value;
use server::config::token_sha256;
use std::time::Duration;

pub const ALICE: &str = "alice-token";
pub const BOB: &str = "bob-token";
/// The caller ids behind the tokens.
pub const ALICE_ID: &str = "alice";
pub const BOB_ID: &str = "bob";

/// Longest an HTTP call of a test waits for its answer.
pub const CLIENT_TIMEOUT_MS: u64 = 30_000;

/// `IDEM__CALLERS` for alice and bob (never the demo caller).
pub fn callers_env() -> String {
    format!(
        r#"[{{id = "{ALICE_ID}", token_sha256 = "{}"}}, {{id = "{BOB_ID}", token_sha256 = "{}"}}]"#,
        token_sha256(ALICE),
        token_sha256(BOB)
    )
}

/// A size from the environment (`IDEM_CRASHES=200`), else the CI default.
pub fn scaled(variable: &str, ci_default: usize) -> usize {
    match std::env::var(variable) {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{variable}={text:?} is not a whole number")),
        Err(_) => ci_default,
    }
}

/// A seed from `IDEM_RELIABILITY_SEED`, else a fresh one; printed so a failing run can be replayed.
pub fn seed(test: &str) -> u64 {
    let seed = match std::env::var("IDEM_RELIABILITY_SEED") {
        Ok(text) => text.trim().parse().expect("IDEM_RELIABILITY_SEED is a u64"),
        Err(_) => rand::random(),
    };
    eprintln!("{test}: seed {seed} (replay with IDEM_RELIABILITY_SEED={seed})");
    seed
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_millis(CLIENT_TIMEOUT_MS))
        .build()
        .expect("client")
}

/// One answer, read whole.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Vec<u8>,
}

impl Reply {
    pub async fn read(response: reqwest::Response) -> Self {
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.bytes().await.expect("body").to_vec();
        Self { status, headers, body }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|error| panic!("not JSON ({error}): {}", self.text()))
    }

    /// The problem `code` of an error answer ("" when the body is not a problem).
    pub fn code(&self) -> String {
        serde_json::from_slice::<Value>(&self.body)
            .ok()
            .and_then(|problem| problem["code"].as_str().map(str::to_owned))
            .unwrap_or_default()
    }

    pub fn is_replay(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }

    pub fn retry_after(&self) -> Option<u64> {
        self.header("retry-after")?.parse().ok()
    }

    pub fn label_id(&self) -> String {
        self.json()["label_id"].as_str().expect("label_id").to_owned()
    }
}

/// A request to `POST /v1/labels`, each part optional so bad input can leave it out.
#[derive(Debug, Clone)]
pub struct LabelPost<'a> {
    pub token: Option<&'a str>,
    pub key: Option<&'a [u8]>,
    pub content_type: Option<&'a str>,
    pub path: &'a str,
    pub body: Vec<u8>,
}

impl<'a> LabelPost<'a> {
    pub fn new(key: &'a str, body: &str) -> Self {
        Self {
            token: Some(ALICE),
            key: Some(key.as_bytes()),
            content_type: Some("application/json"),
            path: "/v1/labels",
            body: body.as_bytes().to_vec(),
        }
    }

    pub async fn send(&self, client: &reqwest::Client, base: &str) -> Result<Reply, reqwest::Error> {
        let mut request = client.post(format!("{base}{}", self.path)).body(self.body.clone());
        if let Some(token) = self.token {
            request = request.bearer_auth(token);
        }
        if let Some(key) = self.key {
            let value = reqwest::header::HeaderValue::from_bytes(key).expect("a header value the client can send");
            request = request.header("idempotency-key", value);
        }
        if let Some(content_type) = self.content_type {
            request = request.header("content-type", content_type);
        }
        Ok(Reply::read(request.send().await?).await)
    }
}

/// A label request body.
pub fn label_body(order_id: u64, parcel_no: u32) -> String {
    format!(r#"{{"order_id":{order_id},"parcel_no":{parcel_no},"weight_g":1450,"service":"ground"}}"#)
}

/// The Fulfilment service's derived key for a parcel (the spec's `label:918273:1:v1`).
pub fn derived_key(order_id: u64, parcel_no: u32) -> String {
    format!("label:{order_id}:{parcel_no}:v1")
}

/// A fresh order id, so tests never share a parcel.
pub fn unique_order_id() -> u64 {
    1 + rand::random::<u64>() % 999_999_999_999
}

/// The sum of one metric's samples over the label sets that contain all of `labels`.
pub fn metric_value(exposition: &str, name: &str, labels: &[&str]) -> f64 {
    exposition
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| line.starts_with(&format!("{name}{{")) || line.starts_with(&format!("{name} ")))
        .filter(|line| labels.iter().all(|label| line.contains(label)))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `GET {base}/metrics`.
pub async fn metrics_text(client: &reqwest::Client, base: &str) -> String {
    let response = client.get(format!("{base}/metrics")).send().await.expect("metrics");
    response.text().await.expect("metrics text")
}

/// Held by tests that assert exact deltas of process-wide counters (the
/// metrics recorder is shared by every in-process service of this binary).
pub async fn counters_exclusive() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}
