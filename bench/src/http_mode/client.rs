//! The Fulfilment service as a client of the Label service: one intent per
//! parcel, a 250 ms deadline per attempt, capped exponential backoff with
//! full jitter on timeouts, 409 and 503 (always the same key in derived
//! mode), never a retry on 422, and a share of intents sent twice at once.
//! The polite profile (the default) also waits at least the server's
//! `Retry-After` and spends a retry quota shared by the whole client
//! ([`RetryQuota`]); the aggressive one does neither. With `--prefer-wait S`
//! every retry asks the server to wait (`Prefer: wait=S`,
//! docs/design.md#waiting) and is given S seconds more; what the waits did
//! is counted in [`WaitTally`].
//!
//! Every attempt's answer is counted by kind ([`AttemptCounts`]) and every
//! label id an intent received is kept ([`IntentLog`]), for the audit.

use super::cli::{CONNECTIONS_MAX_LIMIT, ClientProfile, FulfilmentArgs, KeyMode, PREFER_WAIT_S_MAX};
use crate::engine::Workload;
use crate::intent::{Intent, LABELS_PATH, RunIds};
use crate::recorder::{Outcome, latency_histogram, micros};
use futures::future::BoxFuture;
use hdrhistogram::Histogram;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use std::time::Instant;
use tokio::sync::{Notify, Semaphore, mpsc};

/// The replay header (Stripe's convention, which the Label service follows).
pub const REPLAYED_HEADER: &str = "idempotent-replayed";
/// The request header of RFC 7240 preferences.
pub const PREFER_HEADER: &str = "prefer";
/// The answer's header naming the preferences the server honoured: present
/// when a `Prefer: wait` request did wait.
pub const PREFERENCE_APPLIED_HEADER: &str = "preference-applied";
/// Largest response body the client reads, in bytes.
pub const RESPONSE_BYTES_MAX: usize = 64 * 1024;
/// Most attempts accepted for `--attempts-max`.
pub const ATTEMPTS_LIMIT: u32 = 100;
/// Idle keep-alive connections kept to the server.
const IDLE_CONNECTIONS_MAX: usize = 4_096;
/// The request header carrying the attempt's remaining deadline.
const REQUEST_TIMEOUT_MS_HEADER: &str = "request-timeout-ms";
/// The response header with a finer retry hint than `Retry-After`.
const RETRY_AFTER_MS_HEADER: &str = "retry-after-ms";
/// Longest `Retry-After` the client honours; a longer one is cut to this.
pub const RETRY_AFTER_S_MAX: u64 = 30;

/// The AWS SDKs' standard retry mode's retry quota ("Retry behavior" in the
/// AWS SDKs and Tools reference guide): the client starts with
/// [`RETRY_QUOTA_TOKENS_MAX`] tokens; a retry after an error costs
/// [`RETRY_COST_TOKENS`] (after a timeout [`RETRY_TIMEOUT_COST_TOKENS`]); a
/// success gives back what its own retries cost, or [`SUCCESS_REFUND_TOKENS`]
/// when it needed none. With the quota empty a retry waits the longest
/// backoff first (the SDKs fail it; a Fulfilment service would queue the
/// intent for later rather than lose a parcel), so an overloaded server sees
/// the client's retries slow down instead of multiply.
pub const RETRY_QUOTA_TOKENS_MAX: u64 = 500;
pub const RETRY_COST_TOKENS: u64 = 5;
pub const RETRY_TIMEOUT_COST_TOKENS: u64 = 10;
pub const SUCCESS_REFUND_TOKENS: u64 = 1;

/// The retry quota shared by every intent of one client.
#[derive(Debug)]
pub struct RetryQuota {
    tokens: Mutex<u64>,
    refused: AtomicU64,
}

impl Default for RetryQuota {
    fn default() -> Self {
        Self {
            tokens: Mutex::new(RETRY_QUOTA_TOKENS_MAX),
            refused: AtomicU64::new(0),
        }
    }
}

impl RetryQuota {
    /// Takes the cost of one retry after `answer`; `None` when the quota
    /// cannot pay it (the retry is then deferred).
    pub fn take(&self, answer: &Answer) -> Option<u64> {
        let cost = match answer {
            Answer::Timeout => RETRY_TIMEOUT_COST_TOKENS,
            _ => RETRY_COST_TOKENS,
        };
        let mut tokens = self.tokens.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if *tokens < cost {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        *tokens -= cost;
        Some(cost)
    }

    /// A success gives back what its retries cost, or the small refund.
    pub fn refund(&self, spent: u64) {
        let refund = if spent == 0 { SUCCESS_REFUND_TOKENS } else { spent };
        let mut tokens = self.tokens.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        *tokens = (*tokens + refund).min(RETRY_QUOTA_TOKENS_MAX);
    }

    /// Retries the quota could not pay for (deferred) so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

/// Why the client settings were refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ClientError {
    #[error("--attempts-max must be 1 to {ATTEMPTS_LIMIT}")]
    Attempts,
    #[error("--connections-max must be 1 to {CONNECTIONS_MAX_LIMIT}")]
    Connections,
    #[error("--duplicate-share must be between 0 and 1")]
    DuplicateShare,
    #[error("--deadline-ms must be at least 1")]
    Deadline,
    #[error("--prefer-wait must be 1 to {PREFER_WAIT_S_MAX} seconds")]
    PreferWait,
    #[error("the Label service URL is not valid: {0}")]
    Url(String),
    #[error("the HTTP client could not be built: {0}")]
    Build(String),
}

/// The client's settings, checked.
#[derive(Debug, Clone)]
pub struct ClientSettings {
    /// `POST` targets, one per instance, parsed once.
    pub labels_urls: Vec<reqwest::Url>,
    pub token: String,
    pub key_mode: KeyMode,
    pub profile: ClientProfile,
    pub deadline: Duration,
    pub attempts_max: u32,
    /// Requests on the wire at once: the connection pool's bound.
    pub connections_max: usize,
    pub backoff_base: Duration,
    pub backoff_cap: Duration,
    pub duplicate_share: f64,
    pub seed: u64,
    /// `--prefer-wait`: seconds every retry asks the server to wait.
    pub prefer_wait_s: Option<u64>,
}

impl ClientSettings {
    /// The longest one copy of an intent can take: every attempt at its
    /// deadline (and its wait) and every backoff at its cap, plus a margin
    /// for scheduling.
    pub fn copy_time_max(&self) -> Duration {
        let per_attempt = self.deadline
            + self.prefer_wait().unwrap_or_default()
            + self.backoff_cap
            + Duration::from_secs(RETRY_AFTER_S_MAX);
        per_attempt * self.attempts_max + Duration::from_secs(5)
    }

    /// The wait every retry asks for, if any.
    pub fn prefer_wait(&self) -> Option<Duration> {
        self.prefer_wait_s.map(Duration::from_secs)
    }

    /// Whether attempt `attempt` (from 1) asks to wait. Only retries do: a
    /// first attempt cannot find its own key in progress (only a duplicate
    /// of it can), and it must keep the plain deadline, since the bench
    /// measures the service's answer to new work within it. A retry is
    /// exactly the request that meets its earlier attempt still running, as
    /// a real client's does after a timeout.
    fn asks_to_wait(&self, attempt: u32) -> bool {
        self.prefer_wait_s.is_some() && attempt > 1
    }

    pub fn new(base_urls: &[String], args: &FulfilmentArgs, seed: u64) -> Result<Self, ClientError> {
        if !(1..=ATTEMPTS_LIMIT).contains(&args.attempts_max) {
            return Err(ClientError::Attempts);
        }
        if !(1..=CONNECTIONS_MAX_LIMIT).contains(&args.connections_max) {
            return Err(ClientError::Connections);
        }
        if !(0.0..=1.0).contains(&args.duplicate_share) {
            return Err(ClientError::DuplicateShare);
        }
        if args.deadline_ms == 0 {
            return Err(ClientError::Deadline);
        }
        if args
            .prefer_wait
            .is_some_and(|seconds| !(1..=PREFER_WAIT_S_MAX).contains(&seconds))
        {
            return Err(ClientError::PreferWait);
        }
        if base_urls.is_empty() {
            return Err(ClientError::Url("no URL".into()));
        }
        let labels_urls = base_urls
            .iter()
            .map(|base_url| reqwest::Url::parse(&format!("{}{LABELS_PATH}", base_url.trim_end_matches('/'))))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| ClientError::Url(error.to_string()))?;
        Ok(Self {
            labels_urls,
            token: args.token.clone(),
            key_mode: args.key_mode,
            profile: args.client_profile,
            deadline: Duration::from_millis(args.deadline_ms),
            attempts_max: args.attempts_max,
            connections_max: args.connections_max,
            backoff_base: Duration::from_millis(args.backoff_base_ms.max(1)),
            backoff_cap: Duration::from_millis(args.backoff_cap_ms.max(args.backoff_base_ms).max(1)),
            duplicate_share: args.duplicate_share,
            seed,
            prefer_wait_s: args.prefer_wait,
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

/// What `--prefer-wait` did: the attempts that asked to wait, how those the
/// server made wait ended, and how long they took.
#[derive(Debug, Default)]
pub struct WaitTally {
    waiting_attempts: AtomicU64,
    waited: AtomicU64,
    waited_then_replayed: AtomicU64,
    waiting_still_409: AtomicU64,
    /// Latency of the attempts that waited, in microseconds; made at the
    /// first one.
    waited_latency: Mutex<Option<Histogram<u64>>>,
}

/// [`WaitTally`] at the end of a run, for the report.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PreferWaitReport {
    /// `--prefer-wait`, in seconds.
    pub prefer_wait_s: u64,
    /// Every 409 the client was answered, waiting attempts' included.
    pub answered_409: u64,
    /// Attempts sent with `Prefer: wait` (every retry).
    pub waiting_attempts: u64,
    /// Of those, the ones the server made wait (`Preference-Applied`): their
    /// key was in progress when they came.
    pub waited: u64,
    /// Waiting attempts answered, after waiting, with the other attempt's
    /// saved answer (`Preference-Applied` and `Idempotent-Replayed`): each
    /// a 409 that waiting turned into the answer.
    pub waited_then_replayed: u64,
    /// Waiting attempts that still got 409: the wait ran out, or a waiter
    /// cap refused them at once.
    pub waiting_still_409: u64,
    /// Latency of the attempts that waited, in milliseconds.
    pub waited_latency_ms_p50: f64,
    pub waited_latency_ms_p99: f64,
    pub waited_latency_ms_max: f64,
}

impl WaitTally {
    /// One attempt that asked to wait, answered `answer` after `latency`;
    /// `waited` when the answer said the wait was applied.
    fn record(&self, answer: &Answer, waited: bool, latency: Duration) {
        self.waiting_attempts.fetch_add(1, Ordering::Relaxed);
        if matches!(answer, Answer::Status { status: 409, .. }) {
            self.waiting_still_409.fetch_add(1, Ordering::Relaxed);
        }
        if !waited {
            return;
        }
        self.waited.fetch_add(1, Ordering::Relaxed);
        if matches!(answer, Answer::Created { replayed: true, .. }) {
            self.waited_then_replayed.fetch_add(1, Ordering::Relaxed);
        }
        let mut histogram = self
            .waited_latency
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        histogram
            .get_or_insert_with(|| latency_histogram(3))
            .saturating_record(micros(latency));
    }

    /// The tally, with the run's `answered_409` (every attempt's, from the
    /// answer counts).
    pub fn report(&self, prefer_wait_s: u64, answered_409: u64) -> PreferWaitReport {
        let histogram = self
            .waited_latency
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let ms = |quantile: f64| {
            histogram
                .as_ref()
                .map_or(0.0, |histogram| histogram.value_at_quantile(quantile) as f64 / 1_000.0)
        };
        PreferWaitReport {
            prefer_wait_s,
            answered_409,
            waiting_attempts: self.waiting_attempts.load(Ordering::Relaxed),
            waited: self.waited.load(Ordering::Relaxed),
            waited_then_replayed: self.waited_then_replayed.load(Ordering::Relaxed),
            waiting_still_409: self.waiting_still_409.load(Ordering::Relaxed),
            waited_latency_ms_p50: ms(0.5),
            waited_latency_ms_p99: ms(0.99),
            waited_latency_ms_max: ms(1.0),
        }
    }
}

impl PreferWaitReport {
    /// One line of the text report.
    pub fn render(&self) -> String {
        format!(
            "prefer wait={}: {} 409s answered in all; {} retries asked to wait, {} waited: {} then replayed, {} still 409 (waiting or not); waited latency p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms\n",
            self.prefer_wait_s,
            self.answered_409,
            self.waiting_attempts,
            self.waited,
            self.waited_then_replayed,
            self.waiting_still_409,
            self.waited_latency_ms_p50,
            self.waited_latency_ms_p99,
            self.waited_latency_ms_max,
        )
    }
}

/// Every 409 among the answer counts ([`Answer::kind`] names start with the status).
pub fn answered_409(kinds: &BTreeMap<String, u64>) -> u64 {
    kinds
        .iter()
        .filter(|(kind, _)| kind.starts_with("409"))
        .map(|(_, count)| count)
        .sum()
}

/// Answers to attempts, second by second since the client started: the
/// latency of every admitted attempt (anything but 503 `overloaded`) and the
/// count of shed ones, for the overload profile's phases and recovery time.
#[derive(Debug)]
pub struct AttemptTimeline {
    start: Instant,
    seconds: Mutex<Vec<TimelineSecond>>,
}

/// One second of the [`AttemptTimeline`].
#[derive(Debug, Clone)]
pub struct TimelineSecond {
    /// Latency of admitted attempts, in microseconds.
    pub admitted: Histogram<u64>,
    pub shed: u64,
    /// Attempts answered with a label (first run or replay).
    pub labelled: u64,
}

/// Longest attempt latency the timeline records, in microseconds; longer
/// ones are recorded as this (the client's deadline is far below it).
const TIMELINE_LATENCY_US_MAX: u64 = 60_000_000;
/// Seconds the timeline keeps at most; later attempts are not recorded.
pub const TIMELINE_SECONDS_MAX: usize = 24 * 3600;

impl Default for AttemptTimeline {
    fn default() -> Self {
        Self {
            start: Instant::now(),
            seconds: Mutex::new(Vec::new()),
        }
    }
}

impl AttemptTimeline {
    /// When second 0 began.
    pub fn start(&self) -> Instant {
        self.start
    }

    /// Seconds since the client started, at `at`.
    pub fn second_of(&self, at: Instant) -> usize {
        at.saturating_duration_since(self.start).as_secs() as usize
    }

    fn record(&self, sent: Instant, answer: &Answer) {
        let second = self.second_of(sent);
        if second >= TIMELINE_SECONDS_MAX {
            return;
        }
        let mut seconds = self.seconds.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        while seconds.len() <= second {
            let Ok(admitted) = Histogram::new_with_max(TIMELINE_LATENCY_US_MAX, 3) else {
                return;
            };
            seconds.push(TimelineSecond {
                admitted,
                shed: 0,
                labelled: 0,
            });
        }
        let bucket = &mut seconds[second];
        if matches!(answer, Answer::Created { .. }) {
            bucket.labelled += 1;
        }
        if matches!(answer, Answer::Status { status: 503, code: Some(code) } if code == "overloaded") {
            bucket.shed += 1;
        } else {
            let latency_us = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
            bucket
                .admitted
                .saturating_record(latency_us.min(TIMELINE_LATENCY_US_MAX));
        }
    }

    pub fn snapshot(&self) -> Vec<TimelineSecond> {
        self.seconds
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
    /// One permit per request on the wire ([`ClientSettings::connections_max`]).
    connections: Arc<Semaphore>,
    settings: ClientSettings,
    ids: RunIds,
    pub counts: Arc<AttemptCounts>,
    pub log: Arc<IntentLog>,
    pub quota: Arc<RetryQuota>,
    pub timeline: Arc<AttemptTimeline>,
    pub waits: Arc<WaitTally>,
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
            connections: Arc::new(Semaphore::new(settings.connections_max)),
            settings,
            ids,
            counts: Arc::new(AttemptCounts::default()),
            log: Arc::new(IntentLog::default()),
            quota: Arc::new(RetryQuota::default()),
            timeline: Arc::new(AttemptTimeline::default()),
            waits: Arc::new(WaitTally::default()),
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

    /// Copy `copy_number` of `intent`, sharing this client's connections,
    /// counts and quota.
    fn copy(&self, intent: Intent, copy_number: u32) -> IntentCopy {
        IntentCopy {
            copy_number,
            http: self.http.clone(),
            connections: self.connections.clone(),
            settings: self.settings.clone(),
            counts: self.counts.clone(),
            quota: self.quota.clone(),
            timeline: self.timeline.clone(),
            waits: self.waits.clone(),
            intent,
        }
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
        for copy_number in 0..copies {
            let copy = self.copy(intent, copy_number);
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
    /// 0, or 1 for the second copy of an intent sent twice.
    copy_number: u32,
    http: reqwest::Client,
    connections: Arc<Semaphore>,
    settings: ClientSettings,
    counts: Arc<AttemptCounts>,
    quota: Arc<RetryQuota>,
    timeline: Arc<AttemptTimeline>,
    waits: Arc<WaitTally>,
    intent: Intent,
}

/// One attempt's answer as the attempt loop needs it.
struct Replied {
    answer: Answer,
    /// The server's `Retry-After`, if it sent one.
    retry_after: Option<Duration>,
    /// `Preference-Applied` was present: the server made the attempt wait.
    waited: bool,
}

impl Replied {
    fn unanswered(answer: Answer, retry_after: Option<Duration>) -> Self {
        Self {
            answer,
            retry_after,
            waited: false,
        }
    }
}

impl IntentCopy {
    async fn run(&self) -> CopyResult {
        let derived = self.intent.derived_key();
        let body = self.intent.body();
        let mut result = CopyResult::default();
        let mut quota_spent = 0;
        for attempt in 1..=self.settings.attempts_max {
            let key = match self.settings.key_mode {
                KeyMode::Derived => derived.clone(),
                KeyMode::PerAttempt => format!("attempt-{:032x}", rand::random::<u128>()),
            };
            let sent = Instant::now();
            let asks_to_wait = self.settings.asks_to_wait(attempt);
            let Replied {
                answer,
                retry_after,
                waited,
            } = self.send(self.instance(attempt), &key, &body, asks_to_wait).await;
            self.timeline.record(sent, &answer);
            self.counts.add(&answer);
            if asks_to_wait {
                self.waits.record(&answer, waited, sent.elapsed());
            }
            result.attempts = attempt;
            match answer {
                Answer::Created { label_id, .. } => {
                    self.quota.refund(quota_spent);
                    result.labels.push(label_id);
                    return result;
                }
                retryable if retryable.is_retryable() => {
                    if attempt == self.settings.attempts_max {
                        break;
                    }
                    let (pause, cost) = self.pause_before_retry(&retryable, attempt, retry_after);
                    quota_spent += cost;
                    tokio::time::sleep(pause).await;
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

    /// How long to wait before retrying after `answer`, and the quota it
    /// cost. With the polite client's quota empty the retry is deferred,
    /// not dropped: it waits the longest backoff (and `Retry-After`), as a
    /// Fulfilment service would put the intent back on its queue for later
    /// instead of losing a parcel, so an overloaded server sees at most one
    /// retry per intent per backoff cap.
    fn pause_before_retry(&self, answer: &Answer, attempt: u32, retry_after: Option<Duration>) -> (Duration, u64) {
        let jittered = backoff(&self.settings, attempt);
        let retry_after = retry_after.unwrap_or_default();
        match self.settings.profile {
            ClientProfile::Aggressive => (jittered, 0),
            ClientProfile::Polite => match self.quota.take(answer) {
                Some(cost) => (retry_after + jittered, cost),
                None => (retry_after + self.settings.backoff_cap + jittered, 0),
            },
        }
    }

    /// The instance for `attempt` (from 1): intents start round robin, a
    /// second copy one instance further, and each retry on the next one, so
    /// with several instances no retry goes where the last attempt went.
    fn instance(&self, attempt: u32) -> &reqwest::Url {
        let urls = &self.settings.labels_urls;
        &urls[instance_of(self.intent.index, self.copy_number, attempt, urls.len())]
    }

    /// One attempt, asking the server to wait when `asks_to_wait` (with
    /// the deadline stretched by the wait).
    async fn send(&self, url: &reqwest::Url, key: &str, body: &[u8], asks_to_wait: bool) -> Replied {
        let wait_s = self.settings.prefer_wait_s.filter(|_| asks_to_wait);
        let deadline = self.settings.deadline + Duration::from_secs(wait_s.unwrap_or(0));
        // A connection from the bounded pool, within the attempt's deadline.
        let waited_from = Instant::now();
        let Ok(Ok(_connection)) = tokio::time::timeout(deadline, self.connections.acquire()).await else {
            return Replied::unanswered(Answer::Timeout, None);
        };
        let deadline = deadline.saturating_sub(waited_from.elapsed());
        let mut request = self
            .http
            .post(url.clone())
            .bearer_auth(&self.settings.token)
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            // The time this attempt will still wait, so the server starts
            // no work for it past then (docs/design.md#deadlines).
            .header(REQUEST_TIMEOUT_MS_HEADER, deadline.as_millis().max(1) as u64)
            .body(body.to_vec());
        if let Some(wait_s) = wait_s {
            request = request.header(PREFER_HEADER, format!("wait={wait_s}"));
        }
        let response = match request.timeout(deadline).send().await {
            Ok(response) => response,
            Err(error) if error.is_timeout() => return Replied::unanswered(Answer::Timeout, None),
            Err(_) => return Replied::unanswered(Answer::Transport, None),
        };
        let status = response.status().as_u16();
        let retry_after = retry_after(response.headers());
        let replayed = response
            .headers()
            .get(REPLAYED_HEADER)
            .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"true"));
        let waited = response.headers().contains_key(PREFERENCE_APPLIED_HEADER);
        let bytes = match read_limited(response).await {
            Ok(bytes) => bytes,
            Err(error) if error.is_timeout() => return Replied::unanswered(Answer::Timeout, retry_after),
            Err(_) => return Replied::unanswered(Answer::Transport, retry_after),
        };
        // Only the fields the client needs are decoded, into a small struct:
        // the bench shares the machine's CPU with the server it measures.
        let fields: AnswerFields = serde_json::from_slice(&bytes).unwrap_or_default();
        let answer = match (status, fields.label_id) {
            (201, Some(label_id)) => Answer::Created { label_id, replayed },
            (201, None) => Answer::Status {
                status,
                code: Some("no_label_id".into()),
            },
            _ => Answer::Status {
                status,
                code: fields.code.as_deref().map(sanitise_code),
            },
        };
        Replied {
            answer,
            retry_after,
            waited,
        }
    }
}

/// Which of `instances` attempt `attempt` (from 1) of copy `copy_number` of
/// intent `index` goes to.
fn instance_of(index: u64, copy_number: u32, attempt: u32, instances: usize) -> usize {
    let position = index + u64::from(copy_number) + u64::from(attempt.saturating_sub(1));
    (position % instances.max(1) as u64) as usize
}

/// The server's `Retry-After-Ms` when it sent one (finer, for a stall that
/// clears in less than a second), else `Retry-After` in delay-seconds (the
/// only form the Label service sends); capped at [`RETRY_AFTER_S_MAX`];
/// anything else is ignored.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let milliseconds = headers
        .get(RETRY_AFTER_MS_HEADER)
        .and_then(|value| value.to_str().ok())
        .and_then(|text| text.trim().parse::<u64>().ok());
    if let Some(milliseconds) = milliseconds {
        return Some(Duration::from_millis(milliseconds.min(RETRY_AFTER_S_MAX * 1_000)));
    }
    let seconds: u64 = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds.min(RETRY_AFTER_S_MAX)))
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
        ClientSettings::new(&["http://127.0.0.1:1/".to_owned()], &wrapper.args, 1).unwrap()
    }

    #[test]
    fn the_defaults_are_the_fulfilment_services() {
        let settings = settings(&[]);
        assert_eq!(settings.deadline, Duration::from_millis(250));
        assert_eq!(settings.key_mode, KeyMode::Derived);
        assert_eq!(settings.labels_urls[0].as_str(), "http://127.0.0.1:1/v1/labels");
        let args = Wrapper::parse_from(["test"]).args;
        assert!(matches!(
            ClientSettings::new(&["not a url".to_owned()], &args, 1),
            Err(ClientError::Url(_))
        ));
    }

    /// What the settings refuse `flag value` with.
    fn refusal(flag: &str, value: &str) -> ClientError {
        let args = Wrapper::parse_from(["test", flag, value]).args;
        ClientSettings::new(&["http://x".to_owned()], &args, 1).unwrap_err()
    }

    /// The pool's bound holds: while its only connection is taken, an
    /// attempt times out waiting for one without reaching the server; once
    /// it is free, the next attempt connects.
    #[tokio::test]
    async fn attempts_share_a_bounded_pool_of_connections() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicU64::new(0));
        let counting = accepted.clone();
        // A server that accepts and never answers.
        let server = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((connection, _)) = listener.accept().await {
                counting.fetch_add(1, Ordering::SeqCst);
                held.push(connection);
            }
        });
        let argv = ["test", "--connections-max", "1", "--deadline-ms", "300"];
        let args = Wrapper::parse_from(argv).args;
        let settings = ClientSettings::new(&[url], &args, 1).unwrap();
        let client = FulfilmentClient::new(settings, RunIds::random()).unwrap();
        let copy = client.copy(client.ids.intent(0), 0);
        let url = client.settings.labels_urls[0].clone();
        let taken = client.connections.clone().acquire_owned().await.unwrap();
        let waited = copy.send(&url, "key-0", b"{}", false).await;
        assert_eq!(waited.answer, Answer::Timeout);
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            0,
            "no connection while the pool's only one is taken"
        );
        drop(taken);
        let sent = copy.send(&url, "key-0", b"{}", false).await;
        assert_eq!(sent.answer, Answer::Timeout, "the server never answers");
        assert_eq!(accepted.load(Ordering::SeqCst), 1, "a free connection is used");
        server.abort();
        for refused in ["0", "10001"] {
            assert_eq!(
                refusal("--connections-max", refused),
                ClientError::Connections,
                "{refused}"
            );
        }
    }

    #[test]
    fn only_retries_ask_to_wait_and_their_wait_is_bounded() {
        let plain = settings(&[]);
        assert!(!plain.asks_to_wait(2));
        let waiting = settings(&["--prefer-wait", "2"]);
        assert!(!waiting.asks_to_wait(1), "a first attempt keeps the plain deadline");
        assert!(waiting.asks_to_wait(2) && waiting.asks_to_wait(10));
        assert_eq!(
            waiting.copy_time_max() - plain.copy_time_max(),
            Duration::from_secs(2) * plain.attempts_max
        );
        for refused in ["0", "301"] {
            assert_eq!(refusal("--prefer-wait", refused), ClientError::PreferWait, "{refused}");
        }
    }

    #[test]
    fn the_wait_tally_counts_what_waiting_turned_into_replays() {
        let tally = WaitTally::default();
        let replay = Answer::Created {
            label_id: "L1".into(),
            replayed: true,
        };
        let conflict = Answer::Status {
            status: 409,
            code: Some("request_in_progress".into()),
        };
        tally.record(&replay, true, Duration::from_millis(300));
        tally.record(&replay, false, Duration::from_millis(2));
        tally.record(&conflict, true, Duration::from_secs(2));
        tally.record(&conflict, false, Duration::from_millis(1));
        let kinds = BTreeMap::from([
            ("409_request_in_progress".to_owned(), 5),
            ("201_replayed".to_owned(), 2),
        ]);
        let report = tally.report(2, answered_409(&kinds));
        assert_eq!(
            (
                report.answered_409,
                report.waiting_attempts,
                report.waited,
                report.waited_then_replayed,
                report.waiting_still_409
            ),
            (5, 4, 2, 1, 2)
        );
        assert!((299.0..=301.0).contains(&report.waited_latency_ms_p50), "{report:?}");
        assert!(
            (1_999.0..=2_002.0).contains(&report.waited_latency_ms_max),
            "{report:?}"
        );
        assert!(report.render().contains("1 then replayed"));
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
    fn the_retry_quota_runs_dry_under_failures_and_refills_with_successes() {
        let quota = RetryQuota::default();
        let busy = Answer::Status {
            status: 503,
            code: Some("overloaded".into()),
        };
        let affordable = RETRY_QUOTA_TOKENS_MAX / RETRY_COST_TOKENS;
        for _ in 0..affordable {
            assert_eq!(quota.take(&busy), Some(RETRY_COST_TOKENS));
        }
        assert_eq!(quota.take(&busy), None, "an empty quota pays for no retry");
        assert_eq!(quota.refused(), 1);
        // A success after two retries gives their cost back.
        quota.refund(2 * RETRY_COST_TOKENS);
        assert_eq!(quota.take(&Answer::Timeout), Some(RETRY_TIMEOUT_COST_TOKENS));
        assert_eq!(quota.take(&busy), None);
        // First-try successes refill it slowly.
        for _ in 0..RETRY_COST_TOKENS {
            quota.refund(0);
        }
        assert_eq!(quota.take(&busy), Some(RETRY_COST_TOKENS));
    }

    #[test]
    fn intents_start_round_robin_and_no_retry_goes_where_the_last_attempt_went() {
        let firsts: Vec<usize> = (0..6).map(|index| instance_of(index, 0, 1, 3)).collect();
        assert_eq!(firsts, [0, 1, 2, 0, 1, 2]);
        for index in 0..10 {
            for attempt in 1..10 {
                assert_ne!(instance_of(index, 0, attempt, 3), instance_of(index, 0, attempt + 1, 3));
            }
            // The second copy of an intent sent twice starts elsewhere.
            assert_ne!(instance_of(index, 0, 1, 3), instance_of(index, 1, 1, 3));
        }
        assert_eq!(instance_of(7, 1, 4, 1), 0);
    }

    #[test]
    fn retry_after_ms_wins_over_retry_after_and_is_capped() {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(reqwest::header::RETRY_AFTER, "1".parse().unwrap());
        headers.insert(RETRY_AFTER_MS_HEADER, "100".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_millis(100)));
        headers.insert(RETRY_AFTER_MS_HEADER, "999999999".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(RETRY_AFTER_S_MAX)));
        headers.insert(RETRY_AFTER_MS_HEADER, "soon".parse().unwrap());
        assert_eq!(
            retry_after(&headers),
            Some(Duration::from_secs(1)),
            "malformed: Retry-After"
        );
    }

    #[test]
    fn retry_after_is_read_in_seconds_and_capped() {
        let mut headers = reqwest::header::HeaderMap::new();
        assert_eq!(retry_after(&headers), None);
        headers.insert(reqwest::header::RETRY_AFTER, "2".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(2)));
        headers.insert(reqwest::header::RETRY_AFTER, "86400".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(RETRY_AFTER_S_MAX)));
        headers.insert(
            reqwest::header::RETRY_AFTER,
            "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&headers), None);
    }

    #[test]
    fn the_duplicate_share_is_respected_and_replayable() {
        let mut args = Wrapper::parse_from(["test", "--duplicate-share", "0.1"]).args;
        let client = FulfilmentClient::new(
            ClientSettings::new(&["http://x".to_owned()], &args, 9).unwrap(),
            RunIds::random(),
        )
        .unwrap();
        let duplicated = (0..100_000).filter(|&index| client.is_duplicated(index)).count();
        assert!((9_000..=11_000).contains(&duplicated), "{duplicated}");
        let again = FulfilmentClient::new(
            ClientSettings::new(&["http://x".to_owned()], &args, 9).unwrap(),
            RunIds::random(),
        )
        .unwrap();
        assert!((0..1_000).all(|index| client.is_duplicated(index) == again.is_duplicated(index)));
        args.duplicate_share = 1.5;
        assert_eq!(
            ClientSettings::new(&["http://x".to_owned()], &args, 9).unwrap_err(),
            ClientError::DuplicateShare
        );
    }
}
