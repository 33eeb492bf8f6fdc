//! The HTTP side of every test harness and the bench's spawner: a client
//! with a bounded wait, a reply read whole, and a metric read off a
//! Prometheus exposition.

use serde_json::Value;
use std::time::Duration;

/// Longest an HTTP call of a test waits for its answer.
pub const CLIENT_TIMEOUT_MS: u64 = 30_000;

/// A client whose every call gives up after [`CLIENT_TIMEOUT_MS`].
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_millis(CLIENT_TIMEOUT_MS))
        .build()
        .expect("an HTTP client")
}

/// A client that trusts only the CA in `ca_file` (PEM), for HTTPS servers.
pub fn client_trusting(ca_file: &std::path::Path) -> reqwest::Client {
    let pem = std::fs::read(ca_file).expect("read the CA file");
    let certificates = reqwest::Certificate::from_pem_bundle(&pem).expect("a PEM CA");
    reqwest::Client::builder()
        .timeout(Duration::from_millis(CLIENT_TIMEOUT_MS))
        .tls_certs_only(certificates)
        .build()
        .expect("an HTTP client")
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

    /// The problem `code` of an error answer ("" when the body is not a
    /// problem): for tests that look at any answer.
    pub fn code(&self) -> String {
        serde_json::from_slice::<Value>(&self.body)
            .ok()
            .and_then(|problem| problem["code"].as_str().map(str::to_owned))
            .unwrap_or_default()
    }

    /// The problem `code`, asserting that the answer is an RFC 9457
    /// problem (its media type, and a `status` equal to the answer's).
    pub fn problem_code(&self) -> String {
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "{}",
            self.text()
        );
        let problem = self.json();
        assert_eq!(problem["status"].as_u64(), Some(u64::from(self.status)), "{problem}");
        problem["code"].as_str().expect("code").to_owned()
    }

    pub fn is_replay(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }

    /// `Retry-After` in whole seconds, if the answer has one.
    pub fn retry_after(&self) -> Option<u64> {
        self.header("retry-after")?.parse().ok()
    }

    /// `Retry-After` in whole seconds, asserting that the answer has one.
    pub fn retry_after_s(&self) -> u64 {
        self.header("retry-after")
            .expect("Retry-After")
            .parse()
            .expect("whole seconds")
    }

    pub fn label_id(&self) -> String {
        self.json()["label_id"].as_str().expect("label_id").to_owned()
    }
}

/// The sum of one metric's samples over the label sets that contain all
/// of `labels`.
pub fn metric_value(exposition: &str, name: &str, labels: &[&str]) -> f64 {
    exposition
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| line.starts_with(&format!("{name}{{")) || line.starts_with(&format!("{name} ")))
        .filter(|line| labels.iter().all(|label| line.contains(label)))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
