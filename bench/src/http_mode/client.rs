//! The Fulfilment service as a client of the Label service: one intent per
//! parcel, a 250 ms deadline per attempt, and a share of intents sent twice
//! at once. What to do after each answer is idem-client's decision
//! ([`idem_client::IntentRetry`], the same the library's middleware
//! makes): capped exponential backoff with full jitter on timeouts,
//! connection errors, 409 and 5xx (always the same key in derived mode),
//! never a retry on 422 or another 4xx. The standard profile (the default,
//! the design's client) also waits the server's `Retry-After` and spends a
//! retry budget shared by the whole client ([`RetryBudget`]), giving the
//! intent up when it is empty; the polite one waits the longest backoff
//! more instead; the aggressive one does neither. With
//! `--prefer-wait S` every retry asks the server to wait (`Prefer: wait=S`,
//! docs/design.md#waiting) and is given S seconds more; what the waits did
//! is counted in [`WaitTally`]. The bench keeps its own sender (a bounded
//! pool of connections, instances in turn, the answer's label id read for
//! the audit), so its hot path allocates nothing the decision adds.
//!
//! Every attempt's answer is counted by kind ([`AttemptCounts`]) and every
//! label id an intent received is kept ([`IntentLog`]), for the audit.

use super::cli::{CONNECTIONS_MAX_LIMIT, ClientProfile, FulfilmentArgs, KeyMode, PREFER_WAIT_S_MAX};
use super::connection_pool::{ConnectionPool, PoolOrder};
use crate::engine::Workload;
use crate::intent::{Intent, LABELS_PATH, RunIds};
use crate::recorder::{Outcome, latency_histogram, micros};
use futures::future::BoxFuture;
use hdrhistogram::Histogram;
use idem_client::{
    AnswerClass, IntentRetry, REQUEST_TIMEOUT_MS_HEADER, RetryAfter, RetryAfterUse, RetryBudget, RetryPolicy, Step,
    WhenBudgetEmpty, is_replayed, wait_was_applied,
};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::{Notify, mpsc};

/// The request header of RFC 7240 preferences.
pub const PREFER_HEADER: &str = idem_client::PREFER_HEADER;
/// Largest response body the client reads, in bytes.
pub const RESPONSE_BYTES_MAX: usize = 64 * 1024;
/// Most attempts accepted for `--attempts-max`.
pub const ATTEMPTS_LIMIT: u32 = idem_client::ATTEMPTS_LIMIT;
/// Idle keep-alive connections kept to the server.
const IDLE_CONNECTIONS_MAX: usize = 4_096;
/// Longest `Retry-After` the client honours; a longer one is cut to this.
pub const RETRY_AFTER_S_MAX: u64 = 30;
/// The attempt counter of [`Answer::NoConnection`].
pub const NO_CONNECTION_KIND: &str = "no_connection";
/// The bench gives an intent no deadline of its own: a copy runs until its
/// attempts are spent ([`ClientSettings::copy_time_max`] bounds it).
const INTENT_TIMEOUT_MS: u64 = idem_client::TIMEOUT_MS_LIMIT;

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
    #[error("the retry policy was refused: {0}")]
    Policy(#[from] idem_client::PolicyError),
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
    /// Which waiting attempt gets a connection that comes free.
    pub pool_order: PoolOrder,
    pub backoff_base: Duration,
    pub backoff_cap: Duration,
    pub duplicate_share: f64,
    pub seed: u64,
    /// `--prefer-wait`: seconds every retry asks the server to wait.
    pub prefer_wait_s: Option<u64>,
    /// The retry decision's settings, made from the ones above.
    pub policy: RetryPolicy,
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

    /// The retry budget of a client with these settings: the polite and
    /// standard profiles' share of recent intents, or none (every retry paid) for the
    /// aggressive one.
    fn budget(&self) -> RetryBudget {
        match self.profile {
            ClientProfile::Polite | ClientProfile::Standard => RetryBudget::default(),
            ClientProfile::Aggressive => RetryBudget::unlimited(),
        }
    }

    /// The policy of `args`: only retries ask to wait (idem-client's rule:
    /// a first attempt cannot find its own key in progress, only a
    /// duplicate of it can, and it keeps the plain deadline, since the
    /// bench measures the service's answer to new work within it).
    fn policy(
        args: &FulfilmentArgs,
        backoff_base: Duration,
        backoff_cap: Duration,
    ) -> Result<RetryPolicy, ClientError> {
        let honour_retry_after = RetryAfterUse::Honour {
            max: Duration::from_secs(RETRY_AFTER_S_MAX),
        };
        let (retry_after, when_budget_empty) = match args.client_profile {
            ClientProfile::Polite => (honour_retry_after, WhenBudgetEmpty::WaitBackoffCap),
            ClientProfile::Standard => (honour_retry_after, WhenBudgetEmpty::GiveUp),
            ClientProfile::Aggressive => (RetryAfterUse::Ignore, WhenBudgetEmpty::GiveUp),
        };
        Ok(RetryPolicy::builder()
            .attempts_max(args.attempts_max)
            .attempt_timeout(Duration::from_millis(args.deadline_ms))
            .intent_timeout(Duration::from_millis(INTENT_TIMEOUT_MS))
            .backoff(backoff_base, backoff_cap)
            .retry_after(retry_after)
            .prefer_wait(args.prefer_wait.map(Duration::from_secs))
            .when_budget_empty(when_budget_empty)
            .build()?)
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
        let backoff_base = Duration::from_millis(args.backoff_base_ms.max(1));
        let backoff_cap = Duration::from_millis(args.backoff_cap_ms.max(args.backoff_base_ms).max(1));
        let policy = Self::policy(args, backoff_base, backoff_cap)?;
        Ok(Self {
            labels_urls,
            token: args.token.clone(),
            key_mode: args.key_mode,
            profile: args.client_profile,
            deadline: Duration::from_millis(args.deadline_ms),
            attempts_max: args.attempts_max,
            connections_max: args.connections_max,
            pool_order: args.pool_order,
            backoff_base,
            backoff_cap,
            duplicate_share: args.duplicate_share,
            seed,
            prefer_wait_s: args.prefer_wait,
            policy,
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
    /// No connection from the client's own pool within the deadline: the
    /// request was never sent, so the service neither admitted nor shed it.
    NoConnection,
    /// The connection failed before or while sending.
    Transport,
}

impl Answer {
    /// 503 `overloaded`: admission control shed the attempt.
    pub fn is_shed(&self) -> bool {
        matches!(self, Answer::Status { status: 503, code: Some(code) } if code == "overloaded")
    }

    /// The attempt never left the client (see [`Answer::NoConnection`]).
    pub fn is_unsent(&self) -> bool {
        matches!(self, Answer::NoConnection)
    }

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
            Answer::NoConnection => NO_CONNECTION_KIND.into(),
            Answer::Transport => "transport_error".into(),
        }
    }

    /// The answer as idem-client classifies it (docs/design.md#status-codes).
    pub fn class(&self) -> AnswerClass {
        match self {
            Answer::Created { replayed, .. } => AnswerClass::Done { replayed: *replayed },
            Answer::Status { status, .. } => AnswerClass::of_status(*status, false),
            // To the client's retry decision a pool wait that used up the
            // deadline is a timeout like any other: its retry is paid for
            // from the same budget.
            Answer::Timeout | Answer::NoConnection => AnswerClass::Timeout,
            Answer::Transport => AnswerClass::Connection,
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
/// latency of every admitted attempt (sent, and not answered 503
/// `overloaded`), the count of shed ones and of those never sent, for the
/// overload profile's phases and recovery time.
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
    /// Attempts that got no connection from the client's pool in time.
    pub unsent: u64,
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
                unsent: 0,
                labelled: 0,
            });
        }
        let bucket = &mut seconds[second];
        if matches!(answer, Answer::Created { .. }) {
            bucket.labelled += 1;
        }
        if answer.is_shed() {
            bucket.shed += 1;
        } else if answer.is_unsent() {
            bucket.unsent += 1;
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

/// Maps the intent log is split over, by operation number. With one map
/// of every intent, the seconds in which it grew past 28,000, 57,000 and
/// 115,000 entries (its rehash holding the lock that the dispatcher and
/// every finishing intent take) had a p99 of 35 to 130 ms in every
/// backend's 2,000/s run, against about 10 ms in the others (BENCHMARKS.md,
/// "What is measured, and how"). Split, each map grows in steps a
/// sixty-fourth of the size.
const INTENT_LOG_SHARDS: u64 = 64;

/// Every intent started in the run, by operation number.
#[derive(Debug)]
pub struct IntentLog {
    shards: Vec<Mutex<HashMap<u64, IntentEntry>>>,
    copies_running: AtomicU64,
    all_copies_done: Notify,
}

impl Default for IntentLog {
    fn default() -> Self {
        Self {
            shards: (0..INTENT_LOG_SHARDS).map(|_| Mutex::default()).collect(),
            copies_running: AtomicU64::new(0),
            all_copies_done: Notify::new(),
        }
    }
}

impl IntentLog {
    /// The map that holds intent `index`.
    fn entries(&self, index: u64) -> MutexGuard<'_, HashMap<u64, IntentEntry>> {
        let shard = &self.shards[(index % INTENT_LOG_SHARDS) as usize];
        shard.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn all_entries(&self) -> impl Iterator<Item = MutexGuard<'_, HashMap<u64, IntentEntry>>> {
        (0..INTENT_LOG_SHARDS).map(|shard| self.entries(shard))
    }

    fn start(&self, intent: Intent, copies: u32) {
        self.copies_running.fetch_add(u64::from(copies), Ordering::SeqCst);
        self.entries(intent.index).insert(
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
        if let Some(entry) = self.entries(index).get_mut(&index) {
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
        self.all_entries().map(|entries| entries.len()).sum()
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
        let mut entries: Vec<IntentEntry> = self
            .all_entries()
            .flat_map(|entries| entries.values().cloned().collect::<Vec<_>>())
            .collect();
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
    /// An attempt was answered 503 `overloaded`: the copy waited out a
    /// `Retry-After` on the way.
    met_shed: bool,
}

/// The Fulfilment client as a [`Workload`]: operation `index` is intent `index`.
pub struct FulfilmentClient {
    http: reqwest::Client,
    /// One place per request on the wire ([`ClientSettings::connections_max`]).
    connections: Arc<ConnectionPool>,
    settings: ClientSettings,
    ids: RunIds,
    pub counts: Arc<AttemptCounts>,
    pub log: Arc<IntentLog>,
    /// The retry budget every intent of the run shares.
    pub quota: Arc<RetryBudget>,
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
        let quota = Arc::new(settings.budget());
        Ok(Self {
            http,
            connections: ConnectionPool::new(settings.connections_max, settings.pool_order),
            settings,
            ids,
            counts: Arc::new(AttemptCounts::default()),
            log: Arc::new(IntentLog::default()),
            quota,
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
                    return Outcome::success(labelled_outcome(result.met_shed));
                }
                failure = failure.or(result.failure);
            }
            Outcome::failure(failure_label(failure.as_deref()))
        })
    }
}

/// The outcome of a labelled intent: its latency is reported on its own
/// when the copy that got the label was shed on the way (BENCHMARKS.md: a
/// shed must cost a wait that fits the stall, not a second).
fn labelled_outcome(met_shed: bool) -> &'static str {
    if met_shed { "labelled_after_shed" } else { "labelled" }
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
    connections: Arc<ConnectionPool>,
    settings: ClientSettings,
    counts: Arc<AttemptCounts>,
    quota: Arc<RetryBudget>,
    timeline: Arc<AttemptTimeline>,
    waits: Arc<WaitTally>,
    intent: Intent,
}

/// One attempt's answer as the attempt loop needs it.
struct Replied {
    answer: Answer,
    /// The server's `Retry-After`, if it sent one.
    retry_after: Option<RetryAfter>,
    /// `Preference-Applied` was present: the server made the attempt wait.
    waited: bool,
}

impl Replied {
    fn unanswered(answer: Answer, retry_after: Option<RetryAfter>) -> Self {
        Self {
            answer,
            retry_after,
            waited: false,
        }
    }
}

impl IntentCopy {
    /// Sends attempts until idem-client's decision ends the copy.
    async fn run(&self) -> CopyResult {
        let derived = self.intent.derived_key();
        let body = self.intent.body();
        let mut result = CopyResult::default();
        let mut retry = IntentRetry::new(&self.settings.policy, &self.quota, Instant::now());
        while let Ok(plan) = retry.next_attempt(Instant::now()) {
            let key = match self.settings.key_mode {
                KeyMode::Derived => derived.clone(),
                KeyMode::PerAttempt => format!("attempt-{:032x}", rand::random::<u128>()),
            };
            let sent = Instant::now();
            let wait_s = plan.prefer_wait.map(|wait| wait.as_secs());
            let Replied {
                answer,
                retry_after,
                waited,
            } = self
                .send(self.instance(plan.number), &key, &body, plan.timeout, wait_s)
                .await;
            self.timeline.record(sent, &answer);
            self.counts.add(&answer);
            result.met_shed |= answer.is_shed();
            if wait_s.is_some() {
                self.waits.record(&answer, waited, sent.elapsed());
            }
            result.attempts = plan.number;
            match retry.after(&answer.class(), retry_after, Instant::now(), SystemTime::now()) {
                Step::Retry { pause } => tokio::time::sleep(pause).await,
                Step::Finish => {
                    match answer {
                        Answer::Created { label_id, .. } => result.labels.push(label_id),
                        // 422 and every other definitive answer: never retried.
                        other => result.failure = Some(other.kind()),
                    }
                    return result;
                }
                Step::GiveUp(_) => break,
            }
        }
        result.failure = Some("gave_up".into());
        result
    }

    /// The instance for `attempt` (from 1): intents start round robin, a
    /// second copy one instance further, and each retry on the next one, so
    /// with several instances no retry goes where the last attempt went.
    fn instance(&self, attempt: u32) -> &reqwest::Url {
        let urls = &self.settings.labels_urls;
        &urls[instance_of(self.intent.index, self.copy_number, attempt, urls.len())]
    }

    /// One attempt within `deadline`, asking the server to wait `wait_s`
    /// seconds when set (the deadline then includes the wait).
    async fn send(
        &self,
        url: &reqwest::Url,
        key: &str,
        body: &[u8],
        deadline: Duration,
        wait_s: Option<u64>,
    ) -> Replied {
        // A connection from the bounded pool, within the attempt's deadline.
        let waited_from = Instant::now();
        let Some(_connection) = self.connections.acquire(deadline).await else {
            return Replied::unanswered(Answer::NoConnection, None);
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
        let retry_after = RetryAfter::from_headers(response.headers());
        let replayed = is_replayed(response.headers());
        let waited = wait_was_applied(response.headers());
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
        let taken = client.connections.acquire(Duration::ZERO).await.unwrap();
        let deadline = client.settings.deadline;
        let waited = copy.send(&url, "key-0", b"{}", deadline, None).await;
        assert_eq!(waited.answer, Answer::NoConnection);
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            0,
            "no connection while the pool's only one is taken"
        );
        drop(taken);
        let sent = copy.send(&url, "key-0", b"{}", deadline, None).await;
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
        assert_eq!(plain.policy.wait_of_attempt(2), None);
        let waiting = settings(&["--prefer-wait", "2"]);
        assert_eq!(
            waiting.policy.wait_of_attempt(1),
            None,
            "a first attempt keeps the plain deadline"
        );
        assert_eq!(waiting.policy.wait_of_attempt(2), Some(Duration::from_secs(2)));
        assert_eq!(waiting.policy.timeout_of_attempt(10), Duration::from_millis(2_250));
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
    fn the_timeline_counts_an_attempt_never_sent_apart_from_the_admitted() {
        let timeline = AttemptTimeline::default();
        let sent = timeline.start();
        let shed = Answer::Status {
            status: 503,
            code: Some("overloaded".into()),
        };
        for answer in [Answer::Timeout, Answer::NoConnection, Answer::NoConnection, shed] {
            timeline.record(sent, &answer);
        }
        let seconds = timeline.snapshot();
        assert_eq!(
            (seconds[0].admitted.len(), seconds[0].unsent, seconds[0].shed),
            (1, 2, 1),
            "a timeout on the wire is admitted; a pool wait that used the deadline is not"
        );
    }

    #[test]
    fn answers_are_retried_as_idem_client_classifies_them() {
        assert!(Answer::Timeout.class().is_retried());
        assert!(Answer::NoConnection.class().is_retried());
        assert!(Answer::Transport.class().is_retried());
        for status in [409, 500, 502, 503] {
            assert!(Answer::Status { status, code: None }.class().is_retried(), "{status}");
        }
        for status in [400, 401, 413, 422] {
            assert!(!Answer::Status { status, code: None }.class().is_retried(), "{status}");
        }
        let created = Answer::Created {
            label_id: "L1".into(),
            replayed: true,
        };
        assert_eq!(created.class(), AnswerClass::Done { replayed: true });
        assert_eq!(created.kind(), "201_replayed");
        let busy = Answer::Status {
            status: 503,
            code: Some("overloaded".into()),
        };
        assert_eq!(busy.kind(), "503_overloaded");
    }

    #[test]
    fn the_polite_profile_spends_a_budget_and_waits_retry_after_and_the_aggressive_one_neither() {
        let polite = settings(&[
            "--client-profile",
            "polite",
            "--backoff-base-ms",
            "10",
            "--backoff-cap-ms",
            "70",
        ]);
        assert_eq!(
            polite.budget().retries_left(Instant::now()),
            u64::from(idem_client::RETRY_BUDGET_RESERVE_DEFAULT)
        );
        assert_eq!(polite.policy.backoff_ceiling(5), Duration::from_millis(70));
        let quota = polite.budget();
        let now = Instant::now();
        let busy = Answer::Status {
            status: 503,
            code: Some("overloaded".into()),
        };
        let told = Some(RetryAfter::Seconds(2));
        let mut retry = IntentRetry::new(&polite.policy, &quota, now);
        retry.next_attempt(now).unwrap();
        let Step::Retry { pause } = retry.after(&busy.class(), told, now, SystemTime::now()) else {
            panic!("a 503 is retried");
        };
        assert!(pause >= Duration::from_secs(2), "{pause:?}");
        let aggressive = settings(&["--client-profile", "aggressive"]);
        assert_eq!(aggressive.budget().retries_left(now), u64::MAX, "no budget");
        let quota = aggressive.budget();
        let mut retry = IntentRetry::new(&aggressive.policy, &quota, now);
        retry.next_attempt(now).unwrap();
        let Step::Retry { pause } = retry.after(&busy.class(), told, now, SystemTime::now()) else {
            panic!("a 503 is retried");
        };
        assert!(pause <= aggressive.backoff_cap, "Retry-After ignored: {pause:?}");
    }

    #[test]
    fn with_its_retry_quota_empty_the_polite_profile_retries_later_and_the_standard_one_gives_up() {
        let empty = RetryBudget::share_of_intents(0, 0).unwrap();
        let now = Instant::now();
        let busy = Answer::Status {
            status: 503,
            code: Some("overloaded".into()),
        };
        let polite = settings(&["--client-profile", "polite"]);
        let mut retry = IntentRetry::new(&polite.policy, &empty, now);
        retry.next_attempt(now).unwrap();
        let Step::Retry { pause } = retry.after(&busy.class(), None, now, SystemTime::now()) else {
            panic!("the polite client retries unpaid");
        };
        assert!(
            pause >= polite.backoff_cap,
            "and waits the longest backoff more: {pause:?}"
        );
        let standard = settings(&[]);
        assert_eq!(standard.profile, ClientProfile::Standard, "the default");
        assert_eq!(
            standard.budget().retries_left(now),
            u64::from(idem_client::RETRY_BUDGET_RESERVE_DEFAULT)
        );
        let mut retry = IntentRetry::new(&standard.policy, &empty, now);
        retry.next_attempt(now).unwrap();
        let step = retry.after(&busy.class(), None, now, SystemTime::now());
        assert!(
            matches!(step, Step::GiveUp(idem_client::GiveUpReason::BudgetExhausted)),
            "the standard client gives up: {step:?}"
        );
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
