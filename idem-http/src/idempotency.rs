//! [`Idempotency`]: what the layer and the handler-level API share (the
//! store, the tracker of attempts in flight, the application's hooks), and
//! the claim: transaction 1 of docs/design.md#two-transactions, re-sent
//! with the same token when its reply may have been lost.

use crate::Attempt;
use crate::caller::CallerIdentity;
use crate::error::{IdempotencyError, ProblemJson, RenderError, retry_after_seconds};
use crate::metrics::{InvalidMetricPrefix, MetricNames, WaitObserved, WaitOutcome};
use crate::saved;
use axum::http::Extensions;
use axum::response::{IntoResponse, Response};
use futures::future::BoxFuture;
use std::any::Any;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use store_core::{
    CallerId, ClaimOutcome, ClaimRequest, Fingerprint, HeldLease, IdempotencyKey, IdempotencyStore, SharedClock,
    StoreError, SystemClock, WaitLimits, WaitedClaim, claim_waiting,
};
use tokio_util::task::TaskTracker;

/// Most times one attempt sends its claim. A claim whose reply was lost
/// (a response timeout, an operation timeout during COMMIT, a failed sync)
/// may have committed; sent again with the same token it gets its lease
/// back (`store_core::machine`'s re-sent claim), or claims afresh if it
/// never committed.
pub const CLAIM_SENDS_MAX: u32 = 3;
/// Pause before the n-th re-send of a claim, times n.
pub const CLAIM_RESEND_BACKOFF_MS: u64 = 50;
/// Most times the lease of a claim whose every reply was lost is released
/// in the background.
pub const ORPHAN_RELEASES_MAX: u32 = 4;
/// Pause before the first background release; doubled before each next one.
pub const ORPHAN_RELEASE_BACKOFF_MS: u64 = 100;

/// `Retry-After` of a 503 `store_unavailable` unless the application
/// chooses another, in seconds.
pub const STORE_RETRY_AFTER_S_DEFAULT: u64 = 1;
/// Longest `Retry-After` accepted for store outages, in seconds.
pub const STORE_RETRY_AFTER_S_MAX: u64 = 3_600;

/// Longest wait a request's `Prefer: wait=N` is granted unless the
/// application chooses another cap, in seconds (docs/design.md#waiting).
/// A waiter costs a parked future, not a worker, but its client holds a
/// connection open: ten seconds covers a slow first attempt and stays
/// under common client and proxy timeouts.
pub const WAIT_CAP_S_DEFAULT: u64 = 10;
/// Largest cap accepted for `Prefer: wait`, in seconds.
pub const WAIT_CAP_S_MAX: u64 = 300;

/// The shared part of the layer and the handler-level API: the store, the
/// tracker of attempts in flight (shutdown waits for them), the clock, and
/// the application's choices (who the caller is, how errors look, the
/// metric prefix, the `Retry-After` of store outages). Cheap to clone.
#[derive(Clone)]
pub struct Idempotency {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn IdempotencyStore>,
    clock: SharedClock,
    tasks: TaskTracker,
    store_retry_after_s: u64,
    caller_identity: Arc<dyn CallerIdentity>,
    render: Arc<dyn RenderError>,
    metric_names: MetricNames,
    work_guards: Vec<WorkGuardHook>,
    wait_cap_s: u64,
}

/// A work guard, type-erased, as the attempt's task holds it.
pub(crate) type WorkGuard = Box<dyn Any + Send>;

/// Takes one request extension out of the request, type-erased, for the
/// task to hold: taken, not cloned, so that dropping it while the request
/// waits (`Prefer: wait`) frees the slot it stands for.
type TakeWorkGuard = fn(&mut Extensions) -> Option<WorkGuard>;

/// Takes a work guard again for a request that waited and then became the
/// attempt: the new guard, or the application's answer refusing it.
type RegainWorkGuard = Arc<dyn Fn(&Extensions) -> BoxFuture<'static, Result<WorkGuard, Response>> + Send + Sync>;

/// One guard the attempt's task holds: how it is taken from the request,
/// and how a waiter that becomes the attempt takes it again, if it can.
#[derive(Clone)]
struct WorkGuardHook {
    take: TakeWorkGuard,
    regain: Option<RegainWorkGuard>,
}

fn take_work_guard<T: Clone + Send + Sync + 'static>(extensions: &mut Extensions) -> Option<WorkGuard> {
    extensions.remove::<T>().map(|guard| Box::new(guard) as WorkGuard)
}

/// Builds an [`Idempotency`]; see [`Idempotency::builder`].
pub struct IdempotencyBuilder {
    store: Arc<dyn IdempotencyStore>,
    clock: SharedClock,
    caller_identity: Arc<dyn CallerIdentity>,
    tasks: TaskTracker,
    store_retry_after_s: u64,
    render: Arc<dyn RenderError>,
    metric_names: MetricNames,
    work_guards: Vec<WorkGuardHook>,
    wait_cap_s: u64,
    wait_limits: Option<WaitLimits>,
}

impl IdempotencyBuilder {
    /// The clock the middleware reads wall time from, in place of
    /// [`SystemClock`]. Give it the clock your store reads: the embedded
    /// store and FoundationDB decide lease expiry by a clock they are given
    /// (`store_fdb::EmbeddedStore::open_embedded_with_clock`,
    /// `FdbStore::with_clock`), so a test that moves one
    /// [`store_core::ManualClock`] moves both, and a lease ends without
    /// sleeping. Redis and PostgreSQL stores decide by their servers' clocks
    /// and take none: keep the default with them.
    ///
    /// The middleware reads it in one place: when an attempt's fenced
    /// completion finds its lease taken over, to tell whether the winner's
    /// record is still live (then its answer is replayed) and how long the
    /// winner's lease still runs (the 409's `Retry-After`). Every decision
    /// about a lease or a retention is the store's, on the store's clock; a
    /// clock that disagrees with the store's changes only that answer.
    pub fn clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// The tracker the middleware spawns each attempt's task on. Give it
    /// the one your shutdown waits on (`close()` then `wait()`), so work
    /// that outlived its client still finishes and saves its answer. The
    /// default is a tracker of its own, reachable with [`Idempotency::tasks`].
    pub fn tasks(mut self, tasks: TaskTracker) -> Self {
        self.tasks = tasks;
        self
    }

    /// `Retry-After` of a 503 `store_unavailable`, and the most a 409
    /// `request_in_progress` advises; clamped to 1..=[`STORE_RETRY_AFTER_S_MAX`].
    pub fn store_retry_after_s(mut self, seconds: u64) -> Self {
        self.store_retry_after_s = seconds.clamp(1, STORE_RETRY_AFTER_S_MAX);
        self
    }

    /// How errors are rendered, in place of [`ProblemJson`].
    pub fn render_errors_with(mut self, render: impl RenderError) -> Self {
        self.render = Arc::new(render);
        self
    }

    /// The prefix of every metric name, in place of
    /// [`crate::metrics::METRIC_PREFIX_DEFAULT`].
    pub fn metric_prefix(mut self, prefix: &str) -> Result<Self, InvalidMetricPrefix> {
        self.metric_names = MetricNames::with_prefix(prefix)?;
        Ok(self)
    }

    /// The request extension of type `T`, when present, is cloned and held
    /// by the attempt's task until the claim, the route and the saving of
    /// its answer are done: even when the client hung up or its request
    /// timed out. This is the hook for a slot under a cap on work in
    /// flight (a semaphore permit in an `Arc`): put the slot in the
    /// request's extensions in a middleware outside the layer, and work
    /// that outlives its request keeps counting against the cap. The layer
    /// takes the extension out of the request (the route does not see it),
    /// and a request that waits (`Prefer: wait`) drops it when its wait
    /// starts: a waiter holds no work slot. One that becomes the attempt
    /// after its wait runs without it; to have it take a slot again, name
    /// the guard with [`IdempotencyBuilder::hold_during_work_regaining`]
    /// instead.
    pub fn hold_during_work<T: Clone + Send + Sync + 'static>(mut self) -> Self {
        self.work_guards.push(WorkGuardHook {
            take: take_work_guard::<T>,
            regain: None,
        });
        self
    }

    /// As [`IdempotencyBuilder::hold_during_work`], and a request that
    /// waited (`Prefer: wait`, holding no slot meanwhile) and then became
    /// the attempt takes a new `T` from `regain` before the route runs, so
    /// work never runs outside the application's cap on it
    /// (docs/design.md#waiting). `regain` gets the request's extensions
    /// (the `T` itself was taken out); it may wait, as the application's own
    /// admission would. When it refuses, the key the waiter claimed is
    /// released (the next waiter or retry takes over) and the refusal is
    /// the answer.
    pub fn hold_during_work_regaining<T, Regain, Regained, Refusal>(mut self, regain: Regain) -> Self
    where
        T: Clone + Send + Sync + 'static,
        Regain: Fn(&Extensions) -> Regained + Send + Sync + 'static,
        Regained: Future<Output = Result<T, Refusal>> + Send + 'static,
        Refusal: IntoResponse,
    {
        let regain: RegainWorkGuard = Arc::new(move |extensions: &Extensions| {
            let regained = regain(extensions);
            Box::pin(async move {
                match regained.await {
                    Ok(guard) => Ok(Box::new(guard) as WorkGuard),
                    Err(refusal) => Err(refusal.into_response()),
                }
            })
        });
        self.work_guards.push(WorkGuardHook {
            take: take_work_guard::<T>,
            regain: Some(regain),
        });
        self
    }

    /// The longest wait granted to a request's `Prefer: wait=N`
    /// (RFC 7240): a request that finds its key started by another attempt
    /// waits up to `min(N, cap)` seconds for it to end, then gets its saved
    /// answer (or becomes the attempt, if the other one released the key);
    /// else 409 as without waiting (docs/design.md#waiting). 0 turns waiting
    /// off. Clamped to [`WAIT_CAP_S_MAX`]; the default is
    /// [`WAIT_CAP_S_DEFAULT`]. Waiting needs a store that reports record
    /// changes (`IdempotencyStore::record_changes`); over one that does not,
    /// every request gets 409 at once.
    pub fn wait_cap_s(mut self, seconds: u64) -> Self {
        self.wait_cap_s = seconds.min(WAIT_CAP_S_MAX);
        self
    }

    /// The caps on waiters per key and per store instance and the fallback
    /// poll interval, set on the store's change hub when built (the default:
    /// `WaitLimits::default()`, the hub's own). Past a cap a waiter gets 409
    /// at once. The hub belongs to the store, so every `Idempotency` over the
    /// same store shares them.
    pub fn wait_limits(mut self, limits: WaitLimits) -> Self {
        self.wait_limits = Some(limits);
        self
    }

    /// The configured [`Idempotency`].
    pub fn build(self) -> Idempotency {
        if let (Some(limits), Some(hub)) = (self.wait_limits, self.store.record_changes()) {
            hub.set_limits(limits);
        }
        Idempotency {
            inner: Arc::new(Inner {
                store: self.store,
                clock: self.clock,
                tasks: self.tasks,
                store_retry_after_s: self.store_retry_after_s,
                caller_identity: self.caller_identity,
                render: self.render,
                metric_names: self.metric_names,
                work_guards: self.work_guards,
                wait_cap_s: self.wait_cap_s,
            }),
        }
    }
}

/// What claiming a key gave.
pub enum Begun {
    /// This attempt holds the lease: do the work, then finish the attempt.
    Acquired(Attempt),
    /// The key completed before with the same request: send this.
    Replay(Response),
}

/// What claiming a key while asking to wait gave: the claim's result, and
/// the wait applied when the request did wait (the `Preference-Applied`).
pub(crate) struct BegunWaiting {
    pub(crate) begun: Result<Begun, IdempotencyError>,
    pub(crate) applied_wait_s: Option<u64>,
}

impl BegunWaiting {
    fn without_waiting(begun: Result<Begun, IdempotencyError>) -> Self {
        Self {
            begun,
            applied_wait_s: None,
        }
    }
}

impl Idempotency {
    /// Starts the configuration of the middleware over `store`, with the
    /// application's way of naming a request's caller. Every other
    /// setting has a default.
    pub fn builder(store: Arc<dyn IdempotencyStore>, caller_identity: impl CallerIdentity) -> IdempotencyBuilder {
        IdempotencyBuilder {
            store,
            clock: SystemClock::shared(),
            caller_identity: Arc::new(caller_identity),
            tasks: TaskTracker::new(),
            store_retry_after_s: STORE_RETRY_AFTER_S_DEFAULT,
            render: Arc::new(ProblemJson),
            metric_names: MetricNames::default(),
            work_guards: Vec::new(),
            wait_cap_s: WAIT_CAP_S_DEFAULT,
            wait_limits: None,
        }
    }

    /// The same configuration over another store handle: how a route gets
    /// its own lease and retention. Stores take their `store_core::Policy`
    /// when opened, so open a second handle on the same database with the
    /// route's policy (the embedded store: `FdbStore::new(engine.clone(),
    /// prefix, policy)`, which shares the engine, `.with_clock(clock)` if
    /// you gave one) and give the route's layer the `Idempotency` this
    /// returns. The clock and every other setting are kept.
    pub fn with_store(&self, store: Arc<dyn IdempotencyStore>) -> Self {
        let inner = &self.inner;
        Self {
            inner: Arc::new(Inner {
                store,
                clock: inner.clock.clone(),
                tasks: inner.tasks.clone(),
                store_retry_after_s: inner.store_retry_after_s,
                caller_identity: inner.caller_identity.clone(),
                render: inner.render.clone(),
                metric_names: inner.metric_names.clone(),
                work_guards: inner.work_guards.clone(),
                wait_cap_s: inner.wait_cap_s,
            }),
        }
    }

    /// The store records are kept in.
    pub fn store(&self) -> &Arc<dyn IdempotencyStore> {
        &self.inner.store
    }

    /// The clock the middleware reads ([`IdempotencyBuilder::clock`]).
    pub fn clock(&self) -> &SharedClock {
        &self.inner.clock
    }

    /// Attempts in flight; shutdown waits for them.
    pub fn tasks(&self) -> &TaskTracker {
        &self.inner.tasks
    }

    /// The names of the middleware's counters.
    pub fn metric_names(&self) -> &MetricNames {
        &self.inner.metric_names
    }

    /// The caller of a request, as the application names it.
    pub(crate) fn caller_of(&self, request: &axum::http::request::Parts) -> Option<CallerId> {
        self.inner.caller_identity.caller(request)
    }

    /// The guards the application asked the attempt's task to hold, taken
    /// out of the request.
    pub(crate) fn work_guards(&self, extensions: &mut Extensions) -> Vec<WorkGuard> {
        self.inner
            .work_guards
            .iter()
            .filter_map(|hook| (hook.take)(extensions))
            .collect()
    }

    /// The guards a waiter that became the attempt takes again, from the
    /// hooks named with [`IdempotencyBuilder::hold_during_work_regaining`],
    /// in order; the first refusal is the answer (guards already taken
    /// again are dropped with it).
    pub(crate) async fn regain_work_guards(&self, extensions: &Extensions) -> Result<Vec<WorkGuard>, Response> {
        let mut guards = Vec::new();
        for regain in self.inner.work_guards.iter().filter_map(|hook| hook.regain.as_ref()) {
            guards.push(regain(extensions).await?);
        }
        Ok(guards)
    }

    /// The longest wait granted to `Prefer: wait` ([`IdempotencyBuilder::wait_cap_s`]).
    pub fn wait_cap_s(&self) -> u64 {
        self.inner.wait_cap_s
    }

    /// The response for `error`, rendered the application's way.
    pub fn render(&self, error: IdempotencyError) -> Response {
        self.inner.render.render(error)
    }

    /// Claims (caller, key) for a request with this fingerprint.
    pub async fn begin(
        &self,
        caller: CallerId,
        key: IdempotencyKey,
        fingerprint: Fingerprint,
    ) -> Result<Begun, IdempotencyError> {
        // One token for every send: a re-sent claim is the same attempt.
        let request = ClaimRequest::new(caller, key, fingerprint);
        let outcome = self.claim_resending(&request).await?;
        self.decided(outcome, &request, fingerprint)
    }

    /// Claims (caller, key) as [`Idempotency::begin`] does, and when another
    /// attempt holds the key, waits up to `min(wait_s, cap)` seconds for it
    /// to end (RFC 7240 `Prefer: wait`, docs/design.md#waiting).
    /// `before_waiting` runs once, when the wait starts: the layer drops the
    /// work slot there, so a waiter holds no worker. `hung_up` ends the wait
    /// (never a claim) when the client is gone. Every wait is counted in the
    /// wait metrics ([`crate::metrics::WaitOutcome`]).
    pub(crate) async fn begin_waiting(
        &self,
        caller: CallerId,
        key: IdempotencyKey,
        fingerprint: Fingerprint,
        wait_s: u64,
        before_waiting: impl FnOnce(),
        hung_up: impl Future<Output = ()>,
    ) -> BegunWaiting {
        let request = ClaimRequest::new(caller, key, fingerprint);
        let outcome = match self.claim_resending(&request).await {
            Ok(outcome) => outcome,
            Err(error) => return BegunWaiting::without_waiting(Err(error)),
        };
        let applied_wait_s = wait_s.min(self.inner.wait_cap_s);
        let ClaimOutcome::InProgress { retry_after_ms } = outcome else {
            return BegunWaiting::without_waiting(self.decided(outcome, &request, fingerprint));
        };
        if applied_wait_s == 0 || self.store().record_changes().is_none() {
            return BegunWaiting::without_waiting(Err(self.in_progress(retry_after_ms)));
        }
        before_waiting();
        let observed = WaitObserved::start(self.metric_names());
        let until = tokio::time::Instant::now() + Duration::from_secs(applied_wait_s);
        let waited = claim_waiting(self.store().as_ref(), &request, until, hung_up).await;
        let (begun, outcome) = self.after_waiting(waited, &request, fingerprint);
        observed.end(outcome);
        // Refused (a waiter cap) or gone: not waited, so nothing applied.
        let waited_in_full = !matches!(outcome, WaitOutcome::RefusedCap | WaitOutcome::ClientGone);
        BegunWaiting {
            begun,
            applied_wait_s: waited_in_full.then_some(applied_wait_s),
        }
    }

    /// The answer to a request that waited, and how its wait ended.
    fn after_waiting(
        &self,
        waited: Result<WaitedClaim, StoreError>,
        request: &ClaimRequest,
        fingerprint: Fingerprint,
    ) -> (Result<Begun, IdempotencyError>, WaitOutcome) {
        let waited = match waited {
            Ok(waited) => waited,
            Err(error) => {
                if error.is_retryable() {
                    // The claim's reply was lost: it may hold a lease no one
                    // holds, as in `claim_resending`.
                    self.release_orphan_in_background(request);
                }
                return (Err(self.store_error(&error)), WaitOutcome::Error);
            }
        };
        let outcome = match &waited {
            WaitedClaim::Decided(ClaimOutcome::Acquired(_)) => WaitOutcome::BecameAttempt,
            WaitedClaim::Decided(ClaimOutcome::Replay(_)) => WaitOutcome::Replayed,
            WaitedClaim::Decided(ClaimOutcome::Mismatch) => WaitOutcome::KeyReused,
            WaitedClaim::Decided(ClaimOutcome::InProgress { .. }) | WaitedClaim::StillInProgress { .. } => {
                WaitOutcome::TimedOut
            }
            WaitedClaim::Refused { .. } => WaitOutcome::RefusedCap,
            WaitedClaim::Stopped { .. } => WaitOutcome::ClientGone,
        };
        let begun = match waited {
            WaitedClaim::Decided(outcome) => self.decided(outcome, request, fingerprint),
            WaitedClaim::StillInProgress { retry_after_ms }
            | WaitedClaim::Refused { retry_after_ms, .. }
            | WaitedClaim::Stopped { retry_after_ms } => Err(self.in_progress(retry_after_ms)),
        };
        (begun, outcome)
    }

    /// The answer to a claim that is no longer in progress (or is, for 409).
    fn decided(
        &self,
        outcome: ClaimOutcome,
        request: &ClaimRequest,
        fingerprint: Fingerprint,
    ) -> Result<Begun, IdempotencyError> {
        match outcome {
            ClaimOutcome::Acquired(acquired) => {
                if acquired.takeover {
                    MetricNames::count(self.metric_names().lease_takeovers_total());
                }
                if acquired.late_key {
                    MetricNames::count(self.metric_names().late_keys_total());
                    tracing::warn!(
                        caller = %request.caller,
                        key_sha256 = %request.key.digest(),
                        "late key: this key was purged before; the request may duplicate an earlier one"
                    );
                }
                Ok(Begun::Acquired(Attempt::new(self.clone(), acquired, fingerprint)))
            }
            ClaimOutcome::Replay(saved) => Ok(Begun::Replay(saved::response_from_saved(&saved, true))),
            ClaimOutcome::InProgress { retry_after_ms } => Err(self.in_progress(retry_after_ms)),
            ClaimOutcome::Mismatch => Err(IdempotencyError::KeyReused),
        }
    }

    /// The answer while another attempt holds the lease: 409. A request
    /// that asked to wait (RFC 7240 `Prefer: wait`) gets it only after its
    /// wait ([`Idempotency::begin_waiting`]).
    ///
    /// "Wait briefly" (the specification's status table): the first
    /// attempt usually ends in milliseconds, and the lease's end is only the
    /// bound for an attempt that died, so the advice is the lease's
    /// remaining time capped at the store's `Retry-After`.
    fn in_progress(&self, retry_after_ms: u64) -> IdempotencyError {
        IdempotencyError::RequestInProgress {
            retry_after_s: retry_after_seconds(retry_after_ms).min(self.inner.store_retry_after_s),
        }
    }

    /// Sends the claim, and again with the same token after an error that
    /// may hide a commit, up to [`CLAIM_SENDS_MAX`] times. If every reply
    /// was lost, a lease may be live that no attempt holds (every retry
    /// would get 409 until it ran out): it is released in the background.
    async fn claim_resending(&self, request: &ClaimRequest) -> Result<ClaimOutcome, IdempotencyError> {
        let mut send = 1;
        loop {
            let error = match self.store().claim(request).await {
                Ok(outcome) => return Ok(outcome),
                Err(error) => error,
            };
            if let StoreError::Corrupt(codec) = &error {
                // The caller and digest are what an operator needs to clear
                // the key (idem's server: `server forget-unreadable-record`,
                // RELIABILITY.md section 10).
                tracing::error!(error = %codec, caller = %request.caller, key_sha256 = %request.key.digest(),
                    "a stored record is unreadable; if it stays so, clear it with \
                     `server forget-unreadable-record --caller CALLER --key-sha256 KEY_SHA256`");
                return Err(IdempotencyError::RecordUnreadable);
            }
            if !error.is_retryable() {
                return Err(self.store_error(&error));
            }
            if send == CLAIM_SENDS_MAX {
                tracing::warn!(%error, caller = %request.caller, key_sha256 = %request.key.digest(),
                    "no claim reply; releasing any lease it took in the background");
                self.release_orphan_in_background(request);
                return Err(self.store_error(&error));
            }
            MetricNames::count(self.metric_names().claim_resends_total());
            tokio::time::sleep(Duration::from_millis(CLAIM_RESEND_BACKOFF_MS * u64::from(send))).await;
            send += 1;
        }
    }

    /// Releases the lease `request` may hold without knowing it, a bounded
    /// number of times. Release is fenced by the token: it ends this
    /// attempt's lease if the claim committed, and writes nothing otherwise.
    fn release_orphan_in_background(&self, request: &ClaimRequest) {
        let lease = HeldLease {
            caller: request.caller.clone(),
            key: request.key.clone(),
            token: request.token,
            locked_until_ms: 0,
        };
        let store = self.store().clone();
        self.tasks().spawn(async move {
            let mut backoff_ms = ORPHAN_RELEASE_BACKOFF_MS;
            for _ in 0..ORPHAN_RELEASES_MAX {
                tokio::time::sleep(Duration::from_millis(backoff_ms)).await;
                match store.release(&lease).await {
                    Ok(_) => return,
                    Err(error) if error.is_retryable() => backoff_ms *= 2,
                    Err(error) => {
                        tracing::warn!(%error, "could not release an orphaned lease; it ends when it expires");
                        return;
                    }
                }
            }
            tracing::warn!("could not release an orphaned lease; it ends when it expires");
        });
    }

    /// The error for a store failure: 503 with `Retry-After` when a retry
    /// may succeed (an outage is never a 500), 500 `record_unreadable` for
    /// a record no codec reads, else an internal error. Handlers use it for
    /// their own store calls too, so every outage answers alike.
    pub fn store_error(&self, error: &StoreError) -> IdempotencyError {
        match error {
            _ if error.is_retryable() => IdempotencyError::StoreUnavailable {
                retry_after_s: self.inner.store_retry_after_s,
            },
            StoreError::Corrupt(codec) => {
                tracing::error!(error = %codec, "a stored record is unreadable");
                IdempotencyError::RecordUnreadable
            }
            _ => IdempotencyError::Internal(format!("store: {error}")),
        }
    }
}
