//! The Fulfilment service as a client of the Label service: one intent per
//! parcel, a 250 ms deadline per attempt, capped exponential backoff with
//! full jitter on timeouts, 409 and 503 (always the same key in derived
//! mode), never a retry on 422, and a share of intents sent twice at once.
//!
//! Every attempt's answer is counted by kind ([`AttemptCounts`]) and every
//! label id an intent received is kept ([`IntentLog`]), for the audit.

use super::cli::{FulfilmentArgs, KeyMode};
use crate::engine::Workload;
use crate::intent::{Intent, LABELS_PATH, RunIds};
use crate::recorder::Outcome;
use futures::future::BoxFuture;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{Notify, mpsc};

/// The replay header (Stripe's convention, which the Label service follows).
pub const REPLAYED_HEADER: &str = "idempotent-replayed";
/// Largest response body the client reads, in bytes.
pub const RESPONSE_BYTES_MAX: usize = 64 * 1024;
/// Most attempts accepted for `--attempts-max`.
pub const ATTEMPTS_LIMIT: u32 = 100;
/// Idle keep-alive connections kept to the server.
const IDLE_CONNECTIONS_MAX: usize = 4_096;

/// Why the client settings were refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ClientError {
    #[error("--attempts-max must be 1 to {ATTEMPTS_LIMIT}")]
    Attempts,
    #[error("--duplicate-share must be between 0 and 1")]
    DuplicateShare,
    #[error("--deadline-ms must be at least 1")]
    Deadline,
    #[error("the Label service URL is not valid: {0}")]
    Url(String),
    #[error("the HTTP client could not be built: {0}")]
    Build(String),
}

/// The client's settings, checked.
#[derive(Debug, Clone)]
pub struct ClientSettings {
    pub base_url: String,
    /// `POST` target, parsed once.
    pub labels_url: reqwest::Url,
    pub token: String,
    pub key_mode: KeyMode,
    pub deadline: Duration,
    pub attempts_max: u32,
    pub backoff_base: Duration,
    pub backoff_cap: Duration,
    pub duplicate_share: f64,
    pub seed: u64,
}

impl ClientSettings {
    /// The longest one copy of an intent can take: every attempt at its
    /// deadline and every backoff at its cap, plus a margin for scheduling.
    pub fn copy_time_max(&self) -> Duration {
        let per_attempt = self.deadline + self.backoff_cap;
        per_attempt * self.attempts_max + Duration::from_secs(5)
    }

    pub fn new(base_url: &str, args: &FulfilmentArgs, seed: u64) -> Result<Self, ClientError> {
        if !(1..=ATTEMPTS_LIMIT).contains(&args.attempts_max) {
            return Err(ClientError::Attempts);
        }
        if !(0.0..=1.0).contains(&args.duplicate_share) {
            return Err(ClientError::DuplicateShare);
        }
        if args.deadline_ms == 0 {
            return Err(ClientError::Deadline);
        }
        Ok(Self {
            base_url: base_url.trim_end_matches('/').to_owned(),
            labels_url: reqwest::Url::parse(&format!("{}{LABELS_PATH}", base_url.trim_end_matches('/')))
                .map_err(|error| ClientError::Url(error.to_string()))?,
            token: args.token.clone(),
            key_mode: args.key_mode,
            deadline: Duration::from_millis(args.deadline_ms),
            attempts_max: args.attempts_max,
            backoff_base: Duration::from_millis(args.backoff_base_ms.max(1)),
            backoff_cap: Duration::from_millis(args.backoff_cap_ms.max(args.backoff_base_ms).max(1)),
            duplicate_share: args.duplicate_share,
            seed,
        })
    }
}

/// What one attempt got back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Created {
        label_id: String,
        replayed: bool,
    },
    /// Any other status, with the problem `code` when the body had one.
    Status {
        status: u16,
        code: Option<String>,
    },
    /// No answer within the deadline: the request may or may not have run.
    Timeout,
    /// The connection failed before or while sending.
    Transport,
}

impl Answer {
    /// The counter this answer goes to.
    pub fn kind(&self) -> String {
        match self {
            Answer::Created { replayed: false, .. } => "201_created".into(),
            Answer::Created { replayed: true, .. } => "201_replayed".into(),
            Answer::Status {
                status,
                code: Some(code),
            } => format!("{status}_{code}"),
            Answer::Status { status, code: None } => status.to_string(),
            Answer::Timeout => "timeout".into(),
            Answer::Transport => "transport_error".into(),
        }
    }

    /// Whether the Fulfilment service retries after this answer.
    pub fn is_retryable(&self) -> bool {
        match self {
            Answer::Timeout | Answer::Transport => true,
            Answer::Status { status, .. } => matches!(status, 409 | 503),
            Answer::Created { .. } => false,
        }
    }
}

/// Attempts by answer kind, over the whole run (warm-up included).
#[derive(Debug, Default)]
pub struct AttemptCounts {
    counts: Mutex<BTreeMap<String, u64>>,
}

impl AttemptCounts {
    fn add(&self, answer: &Answer) {
        let mut counts = self.counts.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        *counts.entry(answer.kind()).or_insert(0) += 1;
    }

    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.counts
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

/// What the client knows of one intent once every copy has finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntentEntry {
    pub intent: Intent,
    /// Copies sent (2 when the intent was sent twice at once).
    pub copies: u32,
    /// Copies still running.
    pub copies_running: u32,
    /// Every distinct label id any attempt of any copy received.
    pub labels: BTreeSet<String>,
    /// Attempts sent, all copies together.
    pub attempts: u32,
    /// How each copy ended, when not with a label (`gave_up`, `422_...`).
    pub failures: Vec<String>,
}

/// Every intent started in the run, by operation number.
#[derive(Debug, Default)]
pub struct IntentLog {
    entries: Mutex<HashMap<u64, IntentEntry>>,
    copies_running: AtomicU64,
    all_copies_done: Notify,
}

impl IntentLog {
    fn entries(&self) -> MutexGuard<'_, HashMap<u64, IntentEntry>> {
        self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn start(&self, intent: Intent, copies: u32) {
        self.copies_running.fetch_add(u64::from(copies), Ordering::SeqCst);
        self.entries().insert(
            intent.index,
            IntentEntry {
                intent,
                copies,
                copies_running: copies,
                labels: BTreeSet::new(),
                attempts: 0,
                failures: Vec::new(),
            },
        );
    }

    fn finish_copy(&self, index: u64, result: &CopyResult) {
        if let Some(entry) = self.entries().get_mut(&index) {
            entry.copies_running = entry.copies_running.saturating_sub(1);
            entry.attempts += result.attempts;
            entry.labels.extend(result.labels.iter().cloned());
            if let Some(failure) = &result.failure {
                entry.failures.push(failure.clone());
            }
        }
        if self.copies_running.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.all_copies_done.notify_waiters();
        }
    }

    /// Intents started so far.
    pub fn len(&self) -> usize {
        self.entries().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn copies_running(&self) -> u64 {
        self.copies_running.load(Ordering::SeqCst)
    }

    /// Waits until every copy of every intent has finished, or `limit` passes.
    pub async fn wait_all_done(&self, limit: Duration) -> bool {
        let wait = async {
            loop {
                let notified = self.all_copies_done.notified();
                if self.copies_running() == 0 {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(limit, wait).await.is_ok()
    }

    pub fn snapshot(&self) -> Vec<IntentEntry> {
        let mut entries: Vec<IntentEntry> = self.entries().values().cloned().collect();
        entries.sort_by_key(|entry| entry.intent.index);
        entries
    }
}

/// How one copy of an intent ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct CopyResult {
    labels: Vec<String>,
    attempts: u32,
    failure: Option<String>,
}

/// The Fulfilment client as a [`Workload`]: operation `index` is intent `index`.
pub struct FulfilmentClient {
    http: reqwest::Client,
    settings: ClientSettings,
    ids: RunIds,
    pub counts: Arc<AttemptCounts>,
    pub log: Arc<IntentLog>,
}

impl FulfilmentClient {
    pub fn new(settings: ClientSettings, ids: RunIds) -> Result<Self, ClientError> {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(IDLE_CONNECTIONS_MAX)
            .tcp_nodelay(true)
            .build()
            .map_err(|error| ClientError::Build(error.to_string()))?;
        Ok(Self {
            http,
            settings,
            ids,
            counts: Arc::new(AttemptCounts::default()),
            log: Arc::new(IntentLog::default()),
        })
    }

    pub fn settings(&self) -> &ClientSettings {
        &self.settings
    }

    /// Whether intent `index` is sent twice at once: a hash of the seed and
    /// the index, so a run can be replayed.
    fn is_duplicated(&self, index: u64) -> bool {
        let roll = splitmix64(self.settings.seed ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        (roll as f64 / u64::MAX as f64) < self.settings.duplicate_share
    }
}

impl Workload for FulfilmentClient {
    fn settle(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.log.wait_all_done(self.settings.copy_time_max()).await;
        })
    }

    /// Runs the copies of one intent as tasks of their own and resolves at
    /// the first label (the intent is then satisfied, as the Fulfilment
    /// service would see it) or when every copy has ended without one. A
    /// copy still running carries on and reports to the log for the audit.
    fn operation(&self, index: u64) -> BoxFuture<'static, Outcome> {
        let intent = self.ids.intent(index);
        let copies = if self.is_duplicated(index) { 2 } else { 1 };
        self.log.start(intent, copies);
        let (sender, mut receiver) = mpsc::channel::<CopyResult>(2);
        for _ in 0..copies {
            let copy = IntentCopy {
                http: self.http.clone(),
                settings: self.settings.clone(),
                counts: self.counts.clone(),
                intent,
            };
            let log = self.log.clone();
            let sender = sender.clone();
            tokio::spawn(async move {
                let result = copy.run().await;
                log.finish_copy(index, &result);
                let _ = sender.send(result).await;
            });
        }
        drop(sender);
        Box::pin(async move {
            let mut failure = None;
            while let Some(result) = receiver.recv().await {
                if !result.labels.is_empty() {
                    return Outcome::success("labelled");
                }
                failure = failure.or(result.failure);
            }
            Outcome::failure(failure_label(failure.as_deref()))
        })
    }
}

/// Outcome labels must be `'static`: map a copy's failure to a fixed name.
fn failure_label(failure: Option<&str>) -> &'static str {
    match failure {
        Some("gave_up") => "gave_up",
        Some(kind) if kind.starts_with("422") => "rejected_422",
        Some(kind) if kind.starts_with('4') => "rejected_4xx",
        Some(kind) if kind.starts_with('5') => "failed_5xx",
        _ => "failed",
    }
}

/// One copy of one intent: the attempt loop.
struct IntentCopy {
    http: reqwest::Client,
    settings: ClientSettings,
    counts: Arc<AttemptCounts>,
    intent: Intent,
}

impl IntentCopy {
    async fn run(&self) -> CopyResult {
        let derived = self.intent.derived_key();
        let body = self.intent.body();
        let mut result = CopyResult::default();
        for attempt in 1..=self.settings.attempts_max {
            let key = match self.settings.key_mode {
                KeyMode::Derived => derived.clone(),
                KeyMode::PerAttempt => format!("attempt-{:032x}", rand::random::<u128>()),
            };
            let answer = self.send(&key, &body).await;
            self.counts.add(&answer);
            result.attempts = attempt;
            match answer {
                Answer::Created { label_id, .. } => {
                    result.labels.push(label_id);
                    return result;
                }
                retryable if retryable.is_retryable() => {
                    if attempt < self.settings.attempts_max {
                        tokio::time::sleep(backoff(&self.settings, attempt)).await;
                    }
                }
                // 422 and every other definitive error: never retried.
                other => {
                    result.failure = Some(other.kind());
                    return result;
                }
            }
        }
        result.failure = Some("gave_up".into());
        result
    }

    async fn send(&self, key: &str, body: &[u8]) -> Answer {
        let request = self
            .http
            .post(self.settings.labels_url.clone())
            .bearer_auth(&self.settings.token)
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(body.to_vec())
            .timeout(self.settings.deadline);
        let response = match request.send().await {
            Ok(response) => response,
            Err(error) if error.is_timeout() => return Answer::Timeout,
            Err(_) => return Answer::Transport,
        };
        let status = response.status().as_u16();
        let replayed = response
            .headers()
            .get(REPLAYED_HEADER)
            .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"true"));
        let bytes = match read_limited(response).await {
            Ok(bytes) => bytes,
            Err(error) if error.is_timeout() => return Answer::Timeout,
            Err(_) => return Answer::Transport,
        };
        // Only the fields the client needs are decoded, into a small struct:
        // the bench shares the machine's CPU with the server it measures.
        let fields: AnswerFields = serde_json::from_slice(&bytes).unwrap_or_default();
        match (status, fields.label_id) {
            (201, Some(label_id)) => Answer::Created { label_id, replayed },
            (201, None) => Answer::Status {
                status,
                code: Some("no_label_id".into()),
            },
            _ => Answer::Status {
                status,
                code: fields.code.as_deref().map(sanitise_code),
            },
        }
    }
}

/// What the client reads from an answer: the label (201) or the problem code.
#[derive(Debug, Default, serde::Deserialize)]
struct AnswerFields {
    label_id: Option<String>,
    code: Option<String>,
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

/// Problem codes become counter names: keep them short and plain.
fn sanitise_code(code: &str) -> String {
    code.chars()
        .take(40)
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' })
        .collect()
}

/// Capped exponential backoff with full jitter: a random pause between zero
/// and min(cap, base x 2^(attempt-1)), so retries of many clients spread out.
pub fn backoff(settings: &ClientSettings, attempt: u32) -> Duration {
    let ceiling = backoff_ceiling(settings, attempt);
    Duration::from_micros(rand::random_range(0..=ceiling.as_micros() as u64))
}

pub fn backoff_ceiling(settings: &ClientSettings, attempt: u32) -> Duration {
    let doubling = 1u32 << attempt.saturating_sub(1).min(20);
    settings.backoff_base.saturating_mul(doubling).min(settings.backoff_cap)
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: FulfilmentArgs,
    }

    fn settings(extra: &[&str]) -> ClientSettings {
        let mut argv = vec!["test"];
        argv.extend_from_slice(extra);
        let wrapper = Wrapper::parse_from(argv);
        ClientSettings::new("http://127.0.0.1:1/", &wrapper.args, 1).unwrap()
    }

    #[test]
    fn the_defaults_are_the_fulfilment_services() {
        let settings = settings(&[]);
        assert_eq!(settings.deadline, Duration::from_millis(250));
        assert_eq!(settings.key_mode, KeyMode::Derived);
        assert_eq!(settings.base_url, "http://127.0.0.1:1");
        assert_eq!(settings.labels_url.as_str(), "http://127.0.0.1:1/v1/labels");
        let args = Wrapper::parse_from(["test"]).args;
        assert!(matches!(
            ClientSettings::new("not a url", &args, 1),
            Err(ClientError::Url(_))
        ));
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_with_jitter_below_it() {
        let settings = settings(&["--backoff-base-ms", "10", "--backoff-cap-ms", "70"]);
        let ceilings: Vec<u64> = (1..=5)
            .map(|a| backoff_ceiling(&settings, a).as_millis() as u64)
            .collect();
        assert_eq!(ceilings, [10, 20, 40, 70, 70]);
        for attempt in 1..=5 {
            assert!(backoff(&settings, attempt) <= backoff_ceiling(&settings, attempt));
        }
        assert_eq!(backoff_ceiling(&settings, u32::MAX), Duration::from_millis(70));
    }

    #[test]
    fn only_timeouts_409_and_503_are_retried() {
        assert!(Answer::Timeout.is_retryable());
        assert!(Answer::Transport.is_retryable());
        for status in [409, 503] {
            assert!(Answer::Status { status, code: None }.is_retryable());
        }
        for status in [400, 401, 413, 422, 500, 502] {
            assert!(!Answer::Status { status, code: None }.is_retryable(), "{status}");
        }
        let created = Answer::Created {
            label_id: "L1".into(),
            replayed: true,
        };
        assert_eq!(created.kind(), "201_replayed");
        let busy = Answer::Status {
            status: 503,
            code: Some("overloaded".into()),
        };
        assert_eq!(busy.kind(), "503_overloaded");
    }

    #[test]
    fn the_duplicate_share_is_respected_and_replayable() {
        let mut args = Wrapper::parse_from(["test", "--duplicate-share", "0.1"]).args;
        let client =
            FulfilmentClient::new(ClientSettings::new("http://x", &args, 9).unwrap(), RunIds::random()).unwrap();
        let duplicated = (0..100_000).filter(|&index| client.is_duplicated(index)).count();
        assert!((9_000..=11_000).contains(&duplicated), "{duplicated}");
        let again =
            FulfilmentClient::new(ClientSettings::new("http://x", &args, 9).unwrap(), RunIds::random()).unwrap();
        assert!((0..1_000).all(|index| client.is_duplicated(index) == again.is_duplicated(index)));
        args.duplicate_share = 1.5;
        assert_eq!(
            ClientSettings::new("http://x", &args, 9).unwrap_err(),
            ClientError::DuplicateShare
        );
    }
}
