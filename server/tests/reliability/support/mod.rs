//! What every reliability test shares: the callers, an HTTP client whose
//! answers are read whole, label bodies, the scale knobs, and the backends.

pub mod audit;
pub mod backends;
pub mod process;
pub mod service;

pub use test_support::callers::{ALICE, ALICE_ID, BOB, BOB_ID, callers_env, label_body, unique_order_id};
pub use test_support::http::{Reply, client, metric_value};

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

/// The Fulfilment service's derived key for a parcel (the spec's `label:918273:1:v1`).
pub fn derived_key(order_id: u64, parcel_no: u32) -> String {
    format!("label:{order_id}:{parcel_no}:v1")
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
