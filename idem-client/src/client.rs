//! The typed API over the middleware: send one intent, get what it came to.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_client::{IdemClient, IntentError, IntentKey};
//! let client = IdemClient::builder("http://127.0.0.1:8080").bearer_token("demo-token").build()?;
//! let key = IntentKey::from_parts(&["label", "918273", "1", "v1"])?;
//! let body = br#"{"order_id":918273,"parcel_no":1,"weight_g":1450,"service":"ground"}"#;
//! match client.post("/v1/labels", &key, body.to_vec()).await {
//!     Ok(done) if done.replayed => println!("already made: {}", done.text()),
//!     Ok(done) => println!("made: {}", done.text()),
//!     Err(IntentError::KeyReused { .. }) => println!("same key, other body: a new label version needs a new key"),
//!     Err(error) => println!("not made, or not known yet: {error}"),
//! }
//! # Ok(()) }
//! ```

use crate::answer::AnswerClass;
use crate::budget::RetryBudget;
use crate::clock::{Clock, SystemClock};
use crate::key::IntentKey;
use crate::middleware::{IDEMPOTENCY_KEY_HEADER, IdempotentRetries, IntentReport};
use crate::policy::RetryPolicy;
use crate::retry::GiveUpReason;
use http::Extensions;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use reqwest_middleware::ClientWithMiddleware;
use std::sync::Arc;

/// Largest answer body read, in bytes (the Label service saves at most 1 MiB).
pub const RESPONSE_BYTES_MAX: usize = 1024 * 1024;
/// Longest problem `code` kept from an error answer, in characters.
pub const PROBLEM_CODE_CHARS_MAX: usize = 64;

/// Why a client could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// The base URL does not parse or is not http(s).
    #[error("the service URL is not a valid http(s) URL: {0}")]
    Url(String),
    /// The bearer token cannot be sent in a header.
    #[error("the bearer token must be visible ASCII")]
    Token,
    /// reqwest refused to build its client.
    #[error("the HTTP client could not be built: {0}")]
    Http(String),
}

/// An intent that is done.
#[derive(Clone, PartialEq, Eq)]
pub struct Done {
    /// The answer's status (201 for a label).
    pub status: u16,
    /// The server answered from the key's saved response
    /// (`Idempotent-Replayed: true`): an earlier attempt, perhaps one whose
    /// answer was lost, already did the work.
    pub replayed: bool,
    /// The last attempt waited at the server for another attempt on its
    /// key (`Prefer: wait`, `Preference-Applied`).
    pub waited: bool,
    /// Attempts sent.
    pub attempts: u32,
    /// The answer's body, at most [`RESPONSE_BYTES_MAX`] bytes.
    pub body: Vec<u8>,
}

impl std::fmt::Debug for Done {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Done")
            .field("status", &self.status)
            .field("replayed", &self.replayed)
            .field("waited", &self.waited)
            .field("attempts", &self.attempts)
            .field("body", &self.text())
            .finish()
    }
}

impl Done {
    /// The body as JSON.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.body)
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// The `code` of an RFC 9457 problem answer, when it had one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Problem {
    /// The problem's `code` (the Label service's `idempotency_key_reused`).
    pub code: Option<String>,
}

impl Problem {
    fn of(body: &[u8]) -> Self {
        #[derive(serde::Deserialize)]
        struct Fields {
            code: Option<String>,
        }
        let code = serde_json::from_slice::<Fields>(body)
            .ok()
            .and_then(|fields| fields.code);
        Self {
            code: code.map(|code| code.chars().take(PROBLEM_CODE_CHARS_MAX).collect()),
        }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.code.as_deref().unwrap_or("no problem code"))
    }
}

/// Why an intent did not end done. Only [`IntentError::GaveUp`] and
/// [`IntentError::AnswerUnreadable`] leave the outcome unknown: asking
/// again later with the same key is safe and finds out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IntentError {
    /// 422: the key was used before with another body. Never retried:
    /// this is a bug in the caller. Send the intent's own body, or start a
    /// new intent (a new label version) with a new key.
    #[error(
        "the key was used before with another body (422 {problem}): send the intent's own body, or start a new intent (a new label version) with a new key"
    )]
    KeyReused {
        /// The server's problem.
        problem: Problem,
        /// Attempts sent.
        attempts: u32,
    },
    /// 400: the server refused the key or the request. Never retried: a
    /// corrected request is a new intent.
    #[error("the request was refused as bad (400 {problem}); a corrected request is a new intent")]
    BadRequest {
        /// The server's problem.
        problem: Problem,
        /// Attempts sent.
        attempts: u32,
    },
    /// Another final status (401, 404, 413, ...). Never retried.
    #[error("the request was refused ({status} {problem})")]
    Refused {
        /// The status.
        status: u16,
        /// The server's problem.
        problem: Problem,
        /// Attempts sent.
        attempts: u32,
    },
    /// Every answer was retryable and no retry is left: the attempts, the
    /// budget or the deadline ran out. The work may or may not have run.
    #[error("gave up after {attempts} attempts ({}); the last answer: {last}", reason.name())]
    GaveUp {
        /// Which limit ended it.
        reason: GiveUpReason,
        /// Attempts sent.
        attempts: u32,
        /// The last answer's class name (`unavailable`, `timeout`, ...).
        last: &'static str,
    },
    /// The final answer's body could not be read. The work may have run.
    #[error("the answer could not be read ({0}); asking again with the same key is safe")]
    AnswerUnreadable(String),
    /// The request could not be built or sent at all.
    #[error("the request could not be sent: {0}")]
    Request(String),
}

/// A client of one service: the middleware, its budget, the base URL and
/// the caller's token.
#[derive(Debug, Clone)]
pub struct IdemClient {
    http: ClientWithMiddleware,
    base: reqwest::Url,
    bearer: Option<HeaderValue>,
    budget: Arc<RetryBudget>,
}

/// Builds an [`IdemClient`].
pub struct IdemClientBuilder {
    base_url: String,
    policy: RetryPolicy,
    budget: Option<Arc<RetryBudget>>,
    clock: Arc<dyn Clock>,
    bearer_token: Option<String>,
    http: Option<reqwest::Client>,
}

impl IdemClient {
    /// A client of the service at `base_url` (`http://127.0.0.1:8080`).
    pub fn builder(base_url: impl Into<String>) -> IdemClientBuilder {
        IdemClientBuilder {
            base_url: base_url.into(),
            policy: RetryPolicy::default(),
            budget: None,
            clock: Arc::new(SystemClock),
            bearer_token: None,
            http: None,
        }
    }

    /// The retry budget this client's intents share.
    pub fn budget(&self) -> &Arc<RetryBudget> {
        &self.budget
    }

    /// `POST path` with `body` (JSON) as the intent named by `key`.
    pub async fn post(&self, path: &str, key: &IntentKey, body: Vec<u8>) -> Result<Done, IntentError> {
        let url = self
            .base
            .join(path)
            .map_err(|error| IntentError::Request(error.to_string()))?;
        let mut request = self
            .http
            .post(url)
            .header(IDEMPOTENCY_KEY_HEADER, key.header_value().clone())
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .body(body);
        if let Some(bearer) = &self.bearer {
            request = request.header(AUTHORIZATION, bearer.clone());
        }
        let request = request
            .build()
            .map_err(|error| IntentError::Request(error.to_string()))?;
        let mut extensions = Extensions::new();
        let result = self.http.execute_with_extensions(request, &mut extensions).await;
        let report = extensions.get::<IntentReport>().copied();
        outcome(result, report).await
    }

    /// [`IdemClient::post`] with `body` serialised as JSON.
    pub async fn post_json<T: serde::Serialize>(
        &self,
        path: &str,
        key: &IntentKey,
        body: &T,
    ) -> Result<Done, IntentError> {
        let body = serde_json::to_vec(body).map_err(|error| IntentError::Request(error.to_string()))?;
        self.post(path, key, body).await
    }
}

/// What the middleware's result and report come to.
async fn outcome(
    result: reqwest_middleware::Result<reqwest::Response>,
    report: Option<IntentReport>,
) -> Result<Done, IntentError> {
    if let Some(IntentReport {
        gave_up: Some(reason),
        attempts,
        last,
        ..
    }) = report
    {
        return Err(IntentError::GaveUp {
            reason,
            attempts,
            last: last.name(),
        });
    }
    let response = result.map_err(|error| IntentError::Request(error.to_string()))?;
    let report = report.ok_or_else(|| IntentError::Request("the retry middleware did not run".into()))?;
    let status = response.status().as_u16();
    let body = read_limited(response)
        .await
        .map_err(|error| IntentError::AnswerUnreadable(error.to_string()))?;
    let attempts = report.attempts;
    match report.last {
        AnswerClass::Done { replayed } => Ok(Done {
            status,
            replayed,
            waited: report.waited,
            attempts,
            body,
        }),
        AnswerClass::KeyReused => Err(IntentError::KeyReused {
            problem: Problem::of(&body),
            attempts,
        }),
        AnswerClass::BadRequest => Err(IntentError::BadRequest {
            problem: Problem::of(&body),
            attempts,
        }),
        AnswerClass::Refused { status } => Err(IntentError::Refused {
            status,
            problem: Problem::of(&body),
            attempts,
        }),
        retryable => unreachable!("a retryable answer ({retryable:?}) is retried or given up on"),
    }
}

/// The body, up to [`RESPONSE_BYTES_MAX`]; the rest is not read.
async fn read_limited(mut response: reqwest::Response) -> Result<Vec<u8>, reqwest::Error> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        let room = RESPONSE_BYTES_MAX - body.len();
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() >= RESPONSE_BYTES_MAX {
            break;
        }
    }
    Ok(body)
}

impl IdemClientBuilder {
    /// The retry policy (default: [`RetryPolicy::default`]).
    pub fn policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// A budget shared with other clients (default: one of its own).
    pub fn budget(mut self, budget: Arc<RetryBudget>) -> Self {
        self.budget = Some(budget);
        self
    }

    /// The clock (default: [`SystemClock`]; a [`crate::ManualClock`] in tests).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The caller's bearer token, sent on every attempt.
    pub fn bearer_token(mut self, token: impl Into<String>) -> Self {
        self.bearer_token = Some(token.into());
        self
    }

    /// The reqwest client underneath (default: a new one), for its pool,
    /// TLS and proxy settings.
    pub fn http_client(mut self, http: reqwest::Client) -> Self {
        self.http = Some(http);
        self
    }

    /// The client, checked.
    pub fn build(self) -> Result<IdemClient, BuildError> {
        let base = reqwest::Url::parse(&self.base_url).map_err(|error| BuildError::Url(error.to_string()))?;
        if !matches!(base.scheme(), "http" | "https") {
            return Err(BuildError::Url(format!("scheme {}", base.scheme())));
        }
        let bearer = match &self.bearer_token {
            Some(token) => {
                let mut value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| BuildError::Token)?;
                value.set_sensitive(true);
                Some(value)
            }
            None => None,
        };
        let http = match self.http {
            Some(http) => http,
            None => reqwest::Client::builder()
                .build()
                .map_err(|error| BuildError::Http(error.to_string()))?,
        };
        let budget = self.budget.unwrap_or_default();
        let retries = IdempotentRetries::with_budget(self.policy, budget.clone()).on_clock(self.clock);
        Ok(IdemClient {
            http: reqwest_middleware::ClientBuilder::new(http).with(retries).build(),
            base,
            bearer,
            budget,
        })
    }
}
