//! The workload: the Fulfilment client (`idem-client`'s retry middleware)
//! labelling one parcel per intent with its derived key, each attempt sent
//! to the next instance, every attempt written to the history as it ends.
//!
//! The client is a reqwest-middleware chain: `IdempotentRetries` decides
//! the retries; inside it, [`AttemptRecorder`] sees each attempt alone,
//! points it at the instance whose turn it is, and records what came back
//! (reading the body to digest it, then handing the same bytes on).

use crate::history::{AttemptRecord, JsonLines, Phase, now_ms};
use futures::StreamExt;
use http::Extensions;
use idem_client::{IDEMPOTENCY_KEY_HEADER, IdempotentRetries, IntentKey, RetryBudget, RetryPolicy};
use reqwest::{Request, Response};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use test_support::callers::{ALICE, label_body, unique_order_id};

/// Intents in flight at once while the nemeses run.
const CONCURRENT_INTENTS: usize = 12;
/// Intents driven at once after the heal, and replays at once.
const CONCURRENT_AFTER_HEAL: usize = 16;
/// The parcel every intent labels (one parcel per order).
const PARCEL_NO: u32 = 1;

/// The identity of one intent, carried in the request's extensions to
/// every attempt.
#[derive(Debug, Clone)]
struct IntentTag {
    intent: u64,
    key: String,
    order_id: u64,
    phase: Phase,
    /// Attempt 1 goes to this instance, attempt n to the (n-1)th after it.
    first_instance: usize,
}

/// Attempts sent so far for the intent (in the request's extensions).
#[derive(Debug, Clone, Copy, Default)]
struct AttemptsSent(u32);

/// Points each attempt at its instance and records it.
struct AttemptRecorder {
    urls: Arc<Vec<String>>,
    history: Arc<JsonLines>,
}

#[async_trait::async_trait]
impl Middleware for AttemptRecorder {
    async fn handle(
        &self,
        mut request: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let tag = extensions.get::<IntentTag>().cloned().expect("every intent is tagged");
        let attempt = {
            let sent = extensions.get_or_insert_default::<AttemptsSent>();
            sent.0 += 1;
            sent.0
        };
        let instance = (tag.first_instance + attempt as usize - 1) % self.urls.len();
        let url = format!("{}{}", self.urls[instance], request.url().path());
        *request.url_mut() = reqwest::Url::parse(&url).expect("an instance URL");
        let sent_ms = now_ms();
        let result = next.run(request, extensions).await;
        let mut record = AttemptRecord {
            intent: tag.intent,
            key: tag.key.clone(),
            order_id: tag.order_id,
            parcel_no: PARCEL_NO,
            phase: tag.phase,
            attempt,
            instance,
            sent_ms,
            answered_ms: 0,
            status: None,
            error: None,
            label_id: None,
            replayed: false,
            body_sha256: None,
            original_request: None,
        };
        let answered = match result {
            Ok(response) => read_whole(response).await,
            Err(error) => Err(error),
        };
        record.answered_ms = now_ms();
        let answered = match answered {
            Ok((parts, body)) => {
                describe_answer(&mut record, &parts, &body);
                Ok(Response::from(http::Response::from_parts(parts, body)))
            }
            Err(error) => {
                record.error = Some(transport_error_name(&error));
                Err(error)
            }
        };
        self.history.append(&record);
        answered
    }
}

/// The answer's head and its whole body (a body cut off is a transport error).
async fn read_whole(response: Response) -> reqwest_middleware::Result<(http::response::Parts, Vec<u8>)> {
    let mut head = http::Response::builder()
        .status(response.status())
        .version(response.version());
    for (name, value) in response.headers() {
        head = head.header(name, value);
    }
    let body = response.bytes().await?.to_vec();
    let (parts, ()) = head.body(()).expect("a copied head is valid").into_parts();
    Ok((parts, body))
}

fn describe_answer(record: &mut AttemptRecord, parts: &http::response::Parts, body: &[u8]) {
    record.status = Some(parts.status.as_u16());
    record.replayed = parts
        .headers
        .get("idempotent-replayed")
        .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"true"));
    record.body_sha256 = Some(hex::encode(Sha256::digest(body)));
    record.original_request = parts
        .headers
        .get("original-request")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let json: serde_json::Value = serde_json::from_slice(body).unwrap_or(serde_json::Value::Null);
    if parts.status.as_u16() == 201 {
        record.label_id = json["label_id"].as_str().map(str::to_owned);
    } else {
        record.error = json["code"].as_str().map(str::to_owned);
    }
}

fn transport_error_name(error: &reqwest_middleware::Error) -> String {
    match error {
        reqwest_middleware::Error::Reqwest(error) if error.is_timeout() => "timeout".to_owned(),
        reqwest_middleware::Error::Reqwest(error) if error.is_connect() => "connect".to_owned(),
        reqwest_middleware::Error::Reqwest(_) => "transport".to_owned(),
        reqwest_middleware::Error::Middleware(error) => format!("middleware: {error}"),
    }
}

/// The retry policy of the load: a few attempts within a few seconds, as a
/// caller that cannot wait long would have.
fn load_policy() -> RetryPolicy {
    RetryPolicy::builder()
        .attempts_max(6)
        .attempt_timeout(Duration::from_millis(1_500))
        .intent_timeout(Duration::from_secs(8))
        .backoff(Duration::from_millis(50), Duration::from_millis(400))
        .prefer_wait(Some(Duration::from_secs(2)))
        .build()
        .expect("a valid policy")
}

/// After the heal: the client's budget for an intent that must complete.
fn heal_policy() -> RetryPolicy {
    RetryPolicy::builder()
        .attempts_max(20)
        .attempt_timeout(Duration::from_secs(3))
        .intent_timeout(Duration::from_secs(40))
        .backoff(Duration::from_millis(50), Duration::from_millis(500))
        .prefer_wait(Some(Duration::from_secs(2)))
        .build()
        .expect("a valid policy")
}

/// Replays: one attempt each, on the instance asked.
fn replay_policy() -> RetryPolicy {
    RetryPolicy::builder()
        .attempts_max(1)
        .attempt_timeout(Duration::from_secs(5))
        .intent_timeout(Duration::from_secs(5))
        .build()
        .expect("a valid policy")
}

/// One intent of the workload.
#[derive(Debug, Clone)]
pub struct Intent {
    pub id: u64,
    pub order_id: u64,
    pub key: String,
}

/// The client side of a campaign.
pub struct Workload {
    urls: Arc<Vec<String>>,
    history: Arc<JsonLines>,
    next_intent: AtomicU64,
}

impl Workload {
    pub fn new(urls: Vec<String>, history: Arc<JsonLines>) -> Self {
        Self {
            urls: Arc::new(urls),
            history,
            next_intent: AtomicU64::new(0),
        }
    }

    fn client(&self, policy: RetryPolicy, budget: Arc<RetryBudget>) -> ClientWithMiddleware {
        let http = reqwest::Client::builder()
            .pool_idle_timeout(Duration::from_secs(5))
            .build()
            .expect("an HTTP client");
        ClientBuilder::new(http)
            .with(IdempotentRetries::with_budget(policy, budget))
            .with(AttemptRecorder {
                urls: self.urls.clone(),
                history: self.history.clone(),
            })
            .build()
    }

    /// Sends one intent through `client`; true when it ended with a 201.
    async fn drive(&self, client: &ClientWithMiddleware, intent: &Intent, phase: Phase, first_instance: usize) -> bool {
        let tag = IntentTag {
            intent: intent.id,
            key: intent.key.clone(),
            order_id: intent.order_id,
            phase,
            first_instance,
        };
        let sent = client
            .post(format!("{}/v1/labels", self.urls[first_instance]))
            .bearer_auth(ALICE)
            .header(IDEMPOTENCY_KEY_HEADER, &intent.key)
            .header("content-type", "application/json")
            .body(label_body(intent.order_id, PARCEL_NO))
            .with_extension(tag)
            .send()
            .await;
        sent.is_ok_and(|response| response.status().as_u16() == 201)
    }

    fn new_intent(&self) -> Intent {
        let order_id = unique_order_id();
        let key = IntentKey::from_parts(&["label", &order_id.to_string(), &PARCEL_NO.to_string(), "v1"])
            .expect("a derived key");
        Intent {
            id: self.next_intent.fetch_add(1, Ordering::Relaxed),
            order_id,
            key: key.as_str().to_owned(),
        }
    }

    /// New intents, [`CONCURRENT_INTENTS`] at a time, until `load_over` is set.
    /// Answers every intent it started, and whether it got its 201.
    pub async fn load(&self, load_over: Arc<AtomicBool>) -> Vec<(Intent, bool)> {
        let client = self.client(load_policy(), Arc::new(RetryBudget::default()));
        let intents = futures::stream::iter(0..)
            .take_while(|_| std::future::ready(!load_over.load(Ordering::Relaxed)))
            .map(|number: usize| {
                let client = client.clone();
                async move {
                    let intent = self.new_intent();
                    let done = self
                        .drive(&client, &intent, Phase::Load, number % self.urls.len())
                        .await;
                    (intent, done)
                }
            })
            .buffer_unordered(CONCURRENT_INTENTS)
            .collect::<Vec<_>>()
            .await;
        self.history.flush();
        intents
    }

    /// Drives each intent without its 201 again, with a budget that
    /// outlasts the recovery; answers the intents still without one.
    pub async fn heal(&self, intents: &[(Intent, bool)]) -> usize {
        let client = self.client(heal_policy(), Arc::new(RetryBudget::unlimited()));
        let unfinished: Vec<&Intent> = intents
            .iter()
            .filter(|(_, done)| !done)
            .map(|(intent, _)| intent)
            .collect();
        let still = futures::stream::iter(unfinished.iter().enumerate())
            .map(|(number, intent)| {
                let client = client.clone();
                async move { self.drive(&client, intent, Phase::Heal, number % self.urls.len()).await }
            })
            .buffer_unordered(CONCURRENT_AFTER_HEAL)
            .filter(|done| std::future::ready(!done))
            .count()
            .await;
        self.history.flush();
        still
    }

    /// Asks every intent once more on every instance.
    pub async fn replay_everywhere(&self, intents: &[(Intent, bool)]) {
        let client = self.client(replay_policy(), Arc::new(RetryBudget::unlimited()));
        let asks = intents
            .iter()
            .flat_map(|(intent, _)| (0..self.urls.len()).map(move |instance| (intent, instance)));
        futures::stream::iter(asks)
            .map(|(intent, instance)| {
                let client = client.clone();
                async move { self.drive(&client, intent, Phase::Replay, instance).await }
            })
            .buffer_unordered(CONCURRENT_AFTER_HEAL)
            .count()
            .await;
        self.history.flush();
    }
}
