//! Admission control: a fixed number of workers behind a queue whose delay
//! is bounded by CoDel's rule, so that past capacity the service sheds
//! requests at once instead of queueing work nobody waits for.
//!
//! The rule is CoDel's (Nichols and Jacobson, RFC 8289) as Facebook applies
//! it to server request queues ("Fail at Scale", B. Maurer, ACM Queue 13(8),
//! 2015): while the queue has been empty at some moment of the last
//! `interval`, a request may wait up to `interval` for a worker (a burst is
//! absorbed); once it has not been empty for a whole `interval` (a standing
//! queue, the sign of overload), a request may wait only `target`. A request
//! that gets no worker in its time is answered 503 `overloaded` with
//! `Retry-After` before it claims a key, so no work is started for a client
//! that will have given up. A request that got a worker keeps it until its
//! work ends, even if the client hangs up (the slot travels with the work,
//! see [`crate::limits::InFlightSlot`]); claimed keys are always finished.
//! A request that must queue is refused as soon as its deadline
//! (`Request-Timeout-Ms`) no longer leaves the time admitted work has lately
//! taken ([`WorkTime`]): its client would be gone before its answer.
//!
//! A worker stands for work in this service and its store, not for waits
//! on another service: while a label's carrier call is out, the request sets
//! its worker aside ([`WorkerSeat::set_aside_while`]), and when the answer
//! comes it takes one back at once, ahead of new requests, borrowing one if
//! none is free (docs/design.md#admission). So the number of workers can
//! bound the requests inside the store (what a PostgreSQL pool can serve)
//! without capping the labels a slow carrier can have in flight.
//!
//! Fairness: when the queue is forming, a caller that already holds its
//! share of the workers (workers divided by the callers holding any) is
//! refused at once instead of waiting, so one caller cannot take every
//! worker from the others. Alone, a caller may use them all.
//!
//! [`Codel`] is the pure decision, fed with times by the caller, so it is
//! tested by moving time, never by sleeping.

use crate::auth::Caller;
use crate::error::ApiError;
use crate::limits::InFlightSlot;
use crate::metrics::{
    ADMISSION_QUEUE_WAITING, ADMISSION_SHED_TOTAL, ADMISSION_WORK_EXPECTED_SECONDS, ADMISSION_WORKERS_BORROWED_TOTAL,
};
use crate::setting::{ConfigError, check_range};
use axum::extract::{Request, State};
use axum::http::Extensions;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use idem_http::{IdempotencyError, RequestDeadline};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// Requests served at once. Work past it waits in the admission queue. On
/// two cores the label route is store-bound, so a few dozen keep the store
/// busy while bounding memory and the store's queues. With the PostgreSQL
/// store and its writes not batched, the default is instead half its pool
/// ([`workers_for_postgres_pool`]).
pub const ADMISSION_WORKERS_DEFAULT: usize = 64;
pub const ADMISSION_WORKERS_MAX: usize = 10_000;
/// Requests waiting for a worker at most; past it, refused at once.
pub const ADMISSION_QUEUE_MAX_DEFAULT: usize = 1_024;
pub const ADMISSION_QUEUE_MAX_LIMIT: usize = 100_000;
/// CoDel's target: the wait allowed under a standing queue. A tenth of the
/// client's 250 ms deadline (docs/design.md#client-deadline), not the 5 ms
/// of "Fail at Scale": at 5 ms the service shed, during its own short
/// stalls (a memtable flush), requests it would have answered in time, and
/// each one cost its client a `Retry-After` second; at 2,000/s that was the
/// p99.9 (BENCHMARKS.md, "Carrier retries and the admission target").
pub const ADMISSION_TARGET_MS_DEFAULT: u64 = 25;
/// CoDel's interval: the wait allowed while the queue still empties, and the
/// window in which it must have emptied.
pub const ADMISSION_INTERVAL_MS_DEFAULT: u64 = 100;
/// Longest target or interval accepted.
pub const ADMISSION_MS_MAX: u64 = 10_000;
/// How many recent samples the mean time of admitted work ([`WorkTime`])
/// roughly spans: each new one weighs one sixteenth, so one slow request
/// moves it a little and a change that lasts moves it within a few dozen
/// requests.
pub const WORK_TIME_MEAN_SAMPLES: u64 = 16;
/// Longest sample [`WorkTime`] takes in: one request that took longer (a
/// carrier's timeout) counts as this, so it moves the mean by at most a
/// sixteenth of it.
pub const WORK_TIME_SAMPLE_MAX: Duration = Duration::from_secs(1);

/// The settings of [`Admission`], from `[server.admission]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdmissionConfig {
    /// Unset: [`ADMISSION_WORKERS_DEFAULT`], or with the PostgreSQL store
    /// [`workers_for_postgres_pool`] (the server's `Config::admission`).
    pub workers: Option<usize>,
    pub queue_max: usize,
    pub target_ms: u64,
    pub interval_ms: u64,
}

impl AdmissionConfig {
    /// Checks the section as resolved (its workers with the store's
    /// default filled in).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let admission = self;
        let workers = admission.workers() as u64;
        check_range("server.admission.workers", workers, 1, ADMISSION_WORKERS_MAX as u64)?;
        let queue_max = admission.queue_max as u64;
        check_range(
            "server.admission.queue_max",
            queue_max,
            0,
            ADMISSION_QUEUE_MAX_LIMIT as u64,
        )?;
        check_range(
            "server.admission.interval_ms",
            admission.interval_ms,
            1,
            ADMISSION_MS_MAX,
        )?;
        // CoDel's target is the short wait: never longer than the interval.
        check_range(
            "server.admission.target_ms",
            admission.target_ms,
            1,
            admission.interval_ms,
        )
    }
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        Self {
            workers: None,
            queue_max: ADMISSION_QUEUE_MAX_DEFAULT,
            target_ms: ADMISSION_TARGET_MS_DEFAULT,
            interval_ms: ADMISSION_INTERVAL_MS_DEFAULT,
        }
    }
}

impl AdmissionConfig {
    /// The number of workers: the one configured, or the default.
    pub fn workers(&self) -> usize {
        self.workers.unwrap_or(ADMISSION_WORKERS_DEFAULT)
    }
}

/// The default workers in front of a PostgreSQL pool of `pool_size`
/// connections whose writes are not batched: half of it. Each worker uses
/// at most one connection at a time, and the other half is left for work coming back from a long
/// carrier call (borrowed workers), the parcel lookups, the sweeper and the
/// waiters' notifications, so admitted work does not queue for a
/// connection where admission control cannot see it. Measured at 2,000/s
/// offered on 2 cores (BENCHMARKS.md, "Workers in front of PostgreSQL"): 64
/// workers collapsed (25,486 intents labelled in 30 s, 233,167 client
/// timeouts), 16 left 130,659 client timeouts, 8 shed every excess request
/// at once (no timeouts) in two runs of five.
///
/// Batched writes (the default) do not hold a connection each: a claim or
/// a completion waits in its batcher's bounded queue, and only the
/// batches' few lanes use connections, so the workers must instead cover
/// the requests in flight through a batch's round trip and commit
/// (Little's law: 2,000/s for 20 ms is 40 requests; 8 workers cap that at
/// 400/s), and the general default applies.
pub fn workers_for_postgres_pool(pool_size: usize) -> usize {
    (pool_size / 2).max(1)
}

/// CoDel's decision: how long a request arriving now may wait for a worker.
#[derive(Debug)]
pub struct Codel {
    target: Duration,
    interval: Duration,
    /// When the queue was last seen empty, as time since `epoch`.
    last_empty_ms: AtomicU64,
    epoch: Instant,
}

impl Codel {
    pub fn new(target: Duration, interval: Duration, now: Instant) -> Self {
        assert!(target <= interval, "CoDel's target must not exceed its interval");
        Self {
            target,
            interval,
            last_empty_ms: AtomicU64::new(0),
            epoch: now,
        }
    }

    fn since_epoch_ms(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.epoch).as_millis()).unwrap_or(u64::MAX)
    }

    /// A request found a worker without waiting: the queue is empty now.
    pub fn saw_empty(&self, now: Instant) {
        self.last_empty_ms
            .fetch_max(self.since_epoch_ms(now), Ordering::Relaxed);
    }

    /// How long the queue has not been empty at `now`.
    fn standing_for(&self, now: Instant) -> Duration {
        let since_empty_ms = self
            .since_epoch_ms(now)
            .saturating_sub(self.last_empty_ms.load(Ordering::Relaxed));
        Duration::from_millis(since_empty_ms)
    }

    /// Whether the queue has stood (not been empty) for a whole interval
    /// at `now`: the sign of overload, not of a burst.
    pub fn is_standing(&self, now: Instant) -> bool {
        self.standing_for(now) > self.interval
    }

    /// The wait to ask of a client refused at `now`: as long as the queue
    /// has stood so far, at least one interval and at most `longest`. A
    /// queue that still empties (a burst) is gone within the interval; a
    /// stall of a few hundred milliseconds asks for about that much; only a
    /// queue that has stood for `longest` (sustained overload) asks for
    /// all of it. A shed's wait so fits the stall that caused it
    /// (docs/design.md#admission-queue).
    pub fn retry_after(&self, now: Instant, longest: Duration) -> Duration {
        self.standing_for(now).clamp(self.interval, longest.max(self.interval))
    }

    /// The longest a request arriving at `now` may wait.
    pub fn wait_allowed(&self, now: Instant) -> Duration {
        if self.is_standing(now) {
            self.target
        } else {
            self.interval
        }
    }
}

/// How long admitted work has lately taken, from admission to its end (the
/// last holder of its worker letting go; a carrier call it waited on
/// included, since its client waits for that too): a running mean over about
/// [`WORK_TIME_MEAN_SAMPLES`] requests. Zero until the first sample.
///
/// A request that must queue for a worker is admitted only while its
/// deadline still leaves this much time (docs/design.md#deadlines): one
/// admitted with less would most likely finish for a client already gone,
/// and take a worker from one that is still waiting. The mean is fed only
/// by admitted work, and the rule applies only while every worker is held,
/// so work keeps ending and feeding it: it cannot stay high by refusing
/// everything.
#[derive(Debug, Default)]
pub struct WorkTime {
    mean_us: AtomicU64,
}

impl WorkTime {
    /// One admitted request's work ended after `elapsed`.
    pub fn record(&self, elapsed: Duration) {
        let sample_us = u64::try_from(elapsed.min(WORK_TIME_SAMPLE_MAX).as_micros()).unwrap_or(u64::MAX);
        // Bounded by WORK_TIME_SAMPLE_MAX, so the products cannot overflow.
        let next = |mean_us: u64| match mean_us {
            0 => sample_us,
            _ => (mean_us * (WORK_TIME_MEAN_SAMPLES - 1) + sample_us) / WORK_TIME_MEAN_SAMPLES,
        };
        // The closure always returns Some, so the update always succeeds.
        let _ = self
            .mean_us
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |mean_us| Some(next(mean_us)));
    }

    /// The time work admitted now is expected to take.
    pub fn expected(&self) -> Duration {
        Duration::from_micros(self.mean_us.load(Ordering::Relaxed))
    }
}

/// Workers held per caller, for the fairness rule.
#[derive(Debug, Default)]
struct CallerShares {
    held: Mutex<HashMap<String, usize>>,
}

impl CallerShares {
    /// Counts one more worker for `caller`, unless the queue is forming and
    /// the caller already holds its share; `None` means refused.
    fn take(self: &Arc<Self>, caller: &str, workers: usize, contended: bool) -> Option<CallerShare> {
        let mut held = self.held.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let holders = held.len().max(1);
        let mine = held.get(caller).copied().unwrap_or(0);
        let share = (workers / holders).max(1);
        if contended && holders > 1 && mine >= share {
            return None;
        }
        Some(self.count(&mut held, caller))
    }

    /// Counts one more worker for `caller`, whatever it holds: work coming
    /// back is never refused.
    fn take_always(self: &Arc<Self>, caller: &str) -> CallerShare {
        let mut held = self.held.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        self.count(&mut held, caller)
    }

    fn count(self: &Arc<Self>, held: &mut HashMap<String, usize>, caller: &str) -> CallerShare {
        *held.entry(caller.to_owned()).or_insert(0) += 1;
        CallerShare {
            shares: self.clone(),
            caller: caller.to_owned(),
        }
    }
}

/// One worker counted against a caller, given back on drop.
#[derive(Debug)]
struct CallerShare {
    shares: Arc<CallerShares>,
    caller: String,
}

impl Drop for CallerShare {
    fn drop(&mut self) {
        let mut held = self.shares.held.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(count) = held.get_mut(&self.caller) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.caller);
            }
        }
    }
}

/// What one request's seat holds: a worker taken from the pool, one
/// borrowed ahead of the pool (work coming back from another service,
/// [`WorkerSeat::set_aside_while`]), or nothing.
#[derive(Debug)]
enum Held {
    Vacant,
    Taken { _share: CallerShare },
    Borrowed { _share: CallerShare },
}

/// One request's place among the workers, for the request's whole life: it
/// holds a worker while the request's work runs in the service and its
/// store, and none while the request waits (for another attempt with its
/// key, or for the carrier).
#[derive(Debug)]
struct Seat {
    admission: Admission,
    caller: String,
    /// The request's deadline ([`idem_http::RequestDeadline`]): it never
    /// waits for a worker past the moment its work could still end by it.
    deadline: Option<Instant>,
    held: Mutex<Held>,
}

impl Seat {
    fn new(admission: Admission, caller: String, deadline: Option<Instant>) -> Arc<Self> {
        Arc::new(Self {
            admission,
            caller,
            deadline,
            held: Mutex::new(Held::Vacant),
        })
    }

    /// Fills the vacant seat. A seat holds one worker at a time: a request
    /// is admitted again only after the worker it had was given back (a
    /// waiter drops its work guards before it waits), and takes one back
    /// from a set-aside only after vacating.
    fn hold(&self, held: Held) {
        let previous = std::mem::replace(&mut *self.lock(), held);
        debug_assert!(matches!(previous, Held::Vacant), "a seat holds one worker at a time");
        // Never leak a worker, whatever happened.
        self.admission.give_back(previous);
    }

    /// Gives the worker back; whether there was one.
    fn vacate(&self) -> bool {
        let previous = std::mem::replace(&mut *self.lock(), Held::Vacant);
        let was_held = !matches!(previous, Held::Vacant);
        self.admission.give_back(previous);
        was_held
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A worker held by one admitted request (and its work), given back when the
/// last holder drops it.
#[derive(Debug)]
pub struct Worker {
    seat: Arc<Seat>,
    admitted_at: Instant,
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.seat.vacate();
        let work_time = &self.seat.admission.pool.work_time;
        work_time.record(self.admitted_at.elapsed());
        metrics::gauge!(ADMISSION_WORK_EXPECTED_SECONDS).set(work_time.expected().as_secs_f64());
    }
}

/// The request's seat, for a route whose work waits on another service:
/// [`WorkerSeat::set_aside_while`] gives the worker up for the wait. The
/// admission middleware puts it in the request's extensions; without it (a
/// router without admission control) the extractor gets a seat that holds
/// nothing.
#[derive(Debug, Clone, Default)]
pub struct WorkerSeat {
    seat: Option<Arc<Seat>>,
}

impl WorkerSeat {
    /// Runs `wait` (a call to another service, which needs neither the
    /// service's CPU nor its store) without the request's worker, so the
    /// workers bound what runs in the service and its store, not what waits
    /// elsewhere. Afterwards the request takes a worker back at once, ahead
    /// of every new request: from the pool if one is free, otherwise
    /// borrowed, and the next worker given back repays it. Claimed work is
    /// never queued behind, or shed for, work not yet started.
    pub async fn set_aside_while<F: Future>(&self, wait: F) -> F::Output {
        let Some(seat) = self.seat.as_ref() else {
            return wait.await;
        };
        let had_worker = seat.vacate();
        let output = wait.await;
        if had_worker {
            seat.hold(seat.admission.take_back(&seat.caller));
        }
        output
    }
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for WorkerSeat {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(parts.extensions.get::<WorkerSeat>().cloned().unwrap_or_default())
    }
}

/// Why a request was not admitted; each is a value of the shed metric's
/// `reason` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shed {
    /// It waited as long as CoDel allows and got no worker.
    QueueDelay,
    /// The queue was full.
    QueueFull,
    /// Its caller already held its share of the workers.
    CallerShare,
    /// Its deadline passed, or would have before a worker was free and
    /// its work done ([`WorkTime`]).
    Deadline,
}

/// Every [`Shed`], for registering the metric at zero.
pub const SHED_REASONS: [Shed; 4] = [Shed::QueueDelay, Shed::QueueFull, Shed::CallerShare, Shed::Deadline];

impl Shed {
    pub fn label(self) -> &'static str {
        match self {
            Shed::QueueDelay => "queue_delay",
            Shed::QueueFull => "queue_full",
            Shed::CallerShare => "caller_share",
            Shed::Deadline => "deadline",
        }
    }
}

/// The admission controller shared by every request.
#[derive(Debug, Clone)]
pub struct Admission {
    pool: Arc<WorkerPool>,
    shares: Arc<CallerShares>,
}

impl Admission {
    pub fn new(config: &AdmissionConfig) -> Self {
        Self {
            pool: Arc::new(WorkerPool::new(config)),
            shares: Arc::new(CallerShares::default()),
        }
    }

    /// A worker for `caller`, waiting at most as long as CoDel allows.
    pub async fn admit(&self, caller: &str) -> Result<Worker, Shed> {
        self.admit_into(Seat::new(self.clone(), caller.to_owned(), None)).await
    }

    async fn admit_into(&self, seat: Arc<Seat>) -> Result<Worker, Shed> {
        seat.hold(self.take(&seat.caller, seat.deadline).await?);
        Ok(Worker {
            seat,
            admitted_at: Instant::now(),
        })
    }

    async fn take(&self, caller: &str, deadline: Option<Instant>) -> Result<Held, Shed> {
        if self.pool.try_take(Instant::now()) {
            let share = self.shares.take_always(caller);
            return Ok(Held::Taken { _share: share });
        }
        let share = self
            .shares
            .take(caller, self.pool.workers_total, true)
            .ok_or(Shed::CallerShare)?;
        self.pool.wait_for_worker(deadline).await?;
        Ok(Held::Taken { _share: share })
    }

    /// A worker for work coming back from a wait elsewhere, at once: a free
    /// one, or one borrowed ahead of the pool (a waiting request would have
    /// taken the next free one).
    fn take_back(&self, caller: &str) -> Held {
        let share = self.shares.take_always(caller);
        if self.pool.take_or_borrow() {
            Held::Taken { _share: share }
        } else {
            metrics::counter!(ADMISSION_WORKERS_BORROWED_TOTAL).increment(1);
            Held::Borrowed { _share: share }
        }
    }

    /// Returns a worker: to the pool, or, while borrowed workers are
    /// unrepaid, against the debt.
    fn give_back(&self, held: Held) {
        match held {
            Held::Vacant => {}
            Held::Taken { .. } | Held::Borrowed { .. } => self.pool.give_back(Instant::now()),
        }
    }

    /// Workers free right now (for tests and the invariant's checks).
    #[cfg(test)]
    fn free_workers(&self) -> usize {
        self.pool.lock().free
    }

    #[cfg(test)]
    fn borrowed_unrepaid(&self) -> usize {
        self.pool.lock().borrowed_unrepaid
    }
}

/// The workers and the queue for them, under one lock (a few hundred
/// nanoseconds per request at most; the decisions need the count of free
/// workers, the debt and the queue to agree).
///
/// The queue is CoDel's for how long a request may wait, and adaptive LIFO
/// for who is served next ("Fail at Scale"; Facebook's request scheduling
/// uses both): while the queue still empties, the oldest waiter gets the
/// next worker (first come, first served); once it stands (not empty for a
/// whole interval, the sign of overload), the newest does, because it is
/// the one whose client is still waiting. Under a standing queue the oldest
/// waiters are the likeliest to have been given up on, and serving them
/// first would spend every worker on answers nobody reads.
#[derive(Debug)]
struct WorkerPool {
    workers_total: usize,
    queue_max: usize,
    codel: Codel,
    work_time: WorkTime,
    state: Mutex<PoolState>,
}

#[derive(Debug)]
struct PoolState {
    free: usize,
    /// Workers held by requests, taken or borrowed.
    held: usize,
    /// Workers borrowed ahead of the pool ([`WorkerSeat::set_aside_while`])
    /// and not yet repaid: as many workers given back next are kept out of
    /// the pool. Keeps `free + held - borrowed_unrepaid = workers_total`.
    borrowed_unrepaid: usize,
    waiters: VecDeque<Waiter>,
    next_waiter_id: u64,
}

/// A request waiting for a worker: the worker is handed over through the
/// channel, already counted as held.
#[derive(Debug)]
struct Waiter {
    id: u64,
    handover: oneshot::Sender<()>,
}

impl WorkerPool {
    fn new(config: &AdmissionConfig) -> Self {
        Self {
            workers_total: config.workers(),
            queue_max: config.queue_max,
            codel: Codel::new(
                Duration::from_millis(config.target_ms),
                Duration::from_millis(config.interval_ms),
                Instant::now(),
            ),
            work_time: WorkTime::default(),
            state: Mutex::new(PoolState {
                free: config.workers(),
                held: 0,
                borrowed_unrepaid: 0,
                waiters: VecDeque::new(),
                next_waiter_id: 0,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        // Every update below leaves the state whole before it can panic.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn check(&self, state: &PoolState) {
        debug_assert_eq!(
            state.free + state.held,
            self.workers_total + state.borrowed_unrepaid,
            "free + held - borrowed = workers"
        );
    }

    /// Takes a free worker if there is one and nobody queues for it.
    fn try_take(&self, now: Instant) -> bool {
        let mut state = self.lock();
        if state.free == 0 {
            return false;
        }
        state.free -= 1;
        state.held += 1;
        self.check(&state);
        drop(state);
        self.codel.saw_empty(now);
        true
    }

    /// A free worker, or one borrowed past the pool; whether it was free.
    fn take_or_borrow(&self) -> bool {
        let mut state = self.lock();
        state.held += 1;
        let was_free = state.free > 0;
        if was_free {
            state.free -= 1;
        } else {
            state.borrowed_unrepaid += 1;
        }
        self.check(&state);
        was_free
    }

    /// A worker ends its work: it repays a borrowed one, or goes to a
    /// waiter (the oldest, or under a standing queue the newest), or back
    /// to the pool.
    fn give_back(&self, now: Instant) {
        let newest_first = self.codel.is_standing(now);
        let mut state = self.lock();
        state.held -= 1;
        if state.borrowed_unrepaid > 0 {
            state.borrowed_unrepaid -= 1;
        } else {
            Self::hand_over_or_free(&mut state, newest_first);
        }
        self.check(&state);
    }

    /// One worker, not counted as held, to the next waiter still waiting,
    /// or to the pool.
    fn hand_over_or_free(state: &mut PoolState, newest_first: bool) {
        loop {
            let next = if newest_first {
                state.waiters.pop_back()
            } else {
                state.waiters.pop_front()
            };
            let Some(waiter) = next else {
                state.free += 1;
                break;
            };
            // Counted as held before it is sent: the waiter owns it from
            // the moment the send succeeds, even if it never reads it.
            state.held += 1;
            if waiter.handover.send(()).is_ok() {
                break;
            }
            // Its request was dropped without leaving the queue (it
            // cannot: see `QueuePlace`'s drop), so this does not happen;
            // take the worker back and try the next.
            state.held -= 1;
        }
        metrics::gauge!(ADMISSION_QUEUE_WAITING).set(state.waiters.len() as f64);
    }

    /// Waits for a worker as long as CoDel allows, and never past the last
    /// moment the request's work can start and still end by its deadline
    /// (its deadline less the time work lately takes, [`WorkTime`]).
    async fn wait_for_worker(&self, deadline: Option<Instant>) -> Result<(), Shed> {
        let now = Instant::now();
        let allowed = self.codel.wait_allowed(now);
        let expected = self.work_time.expected();
        let until_latest_start =
            deadline.map(|deadline| deadline.saturating_duration_since(now).saturating_sub(expected));
        let (wait, shed) = match until_latest_start {
            Some(remaining) if remaining.is_zero() => return Err(Shed::Deadline),
            Some(remaining) if remaining < allowed => (remaining, Shed::Deadline),
            _ => (allowed, Shed::QueueDelay),
        };
        let Some(mut place) = QueuePlace::enter(self)? else {
            return Ok(());
        };
        match tokio::time::timeout(wait, &mut place.handover).await {
            Ok(Ok(())) => {
                place.admitted = true;
                Ok(())
            }
            // The sender is dropped only after a send; never without one.
            Ok(Err(_dropped)) => Err(Shed::QueueFull),
            Err(_elapsed) => place.leave_or_take().then_some(()).ok_or(shed),
        }
    }
}

/// A request's place in the admission queue. Dropped without having been
/// admitted (shed, or its request cut off), it leaves the queue, and a
/// worker handed over to it in the meantime goes on to the next waiter.
struct QueuePlace<'a> {
    pool: &'a WorkerPool,
    id: u64,
    handover: oneshot::Receiver<()>,
    admitted: bool,
}

impl<'a> QueuePlace<'a> {
    /// A place at the back of the queue; `None` when a worker was given
    /// back since the request found none, which it takes instead (checked
    /// under the lock every hand-over takes, so no worker stays free while
    /// a request waits).
    fn enter(pool: &'a WorkerPool) -> Result<Option<Self>, Shed> {
        let mut state = pool.lock();
        if state.free > 0 {
            state.free -= 1;
            state.held += 1;
            pool.check(&state);
            return Ok(None);
        }
        if state.waiters.len() >= pool.queue_max {
            return Err(Shed::QueueFull);
        }
        let id = state.next_waiter_id;
        state.next_waiter_id += 1;
        let (sender, receiver) = oneshot::channel();
        state.waiters.push_back(Waiter { id, handover: sender });
        metrics::gauge!(ADMISSION_QUEUE_WAITING).set(state.waiters.len() as f64);
        Ok(Some(Self {
            pool,
            id,
            handover: receiver,
            admitted: false,
        }))
    }

    /// At the end of its wait: whether a worker was handed over just in
    /// time (then it is taken), else it leaves the queue.
    fn leave_or_take(&mut self) -> bool {
        let _state = self.pool.lock();
        // Under the lock, no hand-over is in progress: either it happened
        // and the worker is in the channel, or it never will.
        self.admitted = self.handover.try_recv().is_ok();
        self.admitted
    }
}

impl Drop for QueuePlace<'_> {
    fn drop(&mut self) {
        if self.admitted {
            return;
        }
        let newest_first = self.pool.codel.is_standing(Instant::now());
        let mut state = self.pool.lock();
        if self.handover.try_recv().is_ok() {
            // Handed over after the request stopped waiting for it.
            state.held -= 1;
            WorkerPool::hand_over_or_free(&mut state, newest_first);
        } else {
            let id = self.id;
            state.waiters.retain(|waiter| waiter.id != id);
            metrics::gauge!(ADMISSION_QUEUE_WAITING).set(state.waiters.len() as f64);
        }
        self.pool.check(&state);
    }
}

/// A worker for `caller`, or the 503 a shed request gets (counted by
/// reason): `deadline_exceeded` when its deadline has passed (its client
/// has gone), else `overloaded`, whose `Retry-After-Ms` fits what was seen.
/// A queue that still empties (a stall, a burst) is empty again within
/// CoDel's interval, so a client need not wait a whole `Retry-After`
/// second; a standing queue is overload, and there the client waits the
/// full `Retry-After`. A request shed because its deadline would pass in
/// the queue gets `overloaded` too: its client is still waiting, and a
/// whole second's wait would turn a 300 ms stall into a 1.3 s intent
/// (BENCHMARKS.md, "Retry budgets").
async fn admit_or_shed(seat: Arc<Seat>, retry_after_s: u64) -> Result<Worker, ApiError> {
    let admission = seat.admission.clone();
    let deadline = seat.deadline;
    admission.admit_into(seat).await.map_err(|shed| {
        metrics::counter!(ADMISSION_SHED_TOTAL, "reason" => shed.label()).increment(1);
        let now = Instant::now();
        if shed == Shed::Deadline && deadline.is_some_and(|deadline| deadline <= now) {
            return ApiError::from(IdempotencyError::DeadlineExceeded { retry_after_s });
        }
        let longest = Duration::from_secs(retry_after_s);
        let retry_after = admission.pool.codel.retry_after(now, longest);
        let retry_after_ms = u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX);
        ApiError::Overloaded {
            retry_after_s,
            retry_after_ms: Some(retry_after_ms),
        }
    })
}

/// The middleware: runs after authentication (it needs the caller) and
/// before the routes. The worker joins the request's [`InFlightSlot`], so
/// work that outlives its request keeps it. The request's [`WorkerSeat`]
/// goes with it, for a route that waits on another service, and a
/// [`Readmission`], for the idempotency layer: a request that waits for
/// another attempt (`Prefer: wait`) gives its worker up, and takes one again
/// through it if it becomes the attempt.
pub async fn admit(
    State((admission, retry_after_s)): State<(Admission, u64)>,
    mut request: Request,
    next: Next,
) -> Response {
    let caller = match request.extensions().get::<Caller>() {
        Some(caller) => caller.0.as_str().to_owned(),
        None => String::new(),
    };
    let deadline = request.extensions().get::<RequestDeadline>().map(|deadline| deadline.0);
    let seat = Seat::new(admission, caller, deadline);
    let worker = match admit_or_shed(seat.clone(), retry_after_s).await {
        Ok(worker) => worker,
        Err(shed) => return shed.into_response(),
    };
    let in_flight = request
        .extensions_mut()
        .remove::<InFlightSlot>()
        .unwrap_or_else(InFlightSlot::none);
    request.extensions_mut().insert(Readmission {
        seat: seat.clone(),
        retry_after_s,
        in_flight: in_flight.clone(),
    });
    request.extensions_mut().insert(WorkerSeat { seat: Some(seat) });
    request.extensions_mut().insert(in_flight.with_worker(worker));
    next.run(request).await
}

/// How a request that gave its worker up takes another: admitted again
/// under the same rules (CoDel's wait, the caller's share), keeping its
/// place under the in-flight cap. The idempotency layer uses it for a
/// waiter that becomes the attempt (`crate::idempotency`,
/// docs/design.md#waiting): a waiter holds no worker, the attempt does.
#[derive(Clone)]
pub struct Readmission {
    seat: Arc<Seat>,
    retry_after_s: u64,
    /// The request's place under the in-flight cap, without a worker.
    in_flight: InFlightSlot,
}

impl Readmission {
    /// The request's slot again with a new worker, or the 503 `overloaded`
    /// a request shed by admission gets.
    pub async fn admit(self) -> Result<InFlightSlot, ApiError> {
        let worker = admit_or_shed(self.seat, self.retry_after_s).await?;
        Ok(self.in_flight.with_worker(worker))
    }
}

/// The slot of the request whose extensions these are, taken again through
/// its [`Readmission`]; a request that was never admitted (a router without
/// admission control) needs none, and gets an empty slot.
pub fn readmit(extensions: &Extensions) -> impl Future<Output = Result<InFlightSlot, ApiError>> + Send + use<> {
    let readmission = extensions.get::<Readmission>().cloned();
    async move {
        match readmission {
            Some(readmission) => readmission.admit().await,
            None => Ok(InFlightSlot::none()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codel_at(now: Instant) -> Codel {
        Codel::new(Duration::from_millis(5), Duration::from_millis(100), now)
    }

    #[test]
    fn a_queue_that_empties_allows_the_interval_and_a_standing_one_only_the_target() {
        let start = Instant::now();
        let codel = codel_at(start);
        codel.saw_empty(start);
        assert_eq!(
            codel.wait_allowed(start + Duration::from_millis(50)),
            Duration::from_millis(100)
        );
        assert_eq!(
            codel.wait_allowed(start + Duration::from_millis(100)),
            Duration::from_millis(100)
        );
        // No empty moment for more than an interval: a standing queue.
        assert_eq!(
            codel.wait_allowed(start + Duration::from_millis(101)),
            Duration::from_millis(5)
        );
        // It empties once: bursts are absorbed again.
        codel.saw_empty(start + Duration::from_millis(150));
        assert_eq!(
            codel.wait_allowed(start + Duration::from_millis(200)),
            Duration::from_millis(100)
        );
    }

    #[test]
    fn a_refused_client_is_asked_to_wait_as_long_as_the_queue_has_stood_within_bounds() {
        let start = Instant::now();
        let codel = codel_at(start);
        codel.saw_empty(start);
        let longest = Duration::from_secs(1);
        let asked_at = |ms: u64| codel.retry_after(start + Duration::from_millis(ms), longest);
        // A queue that still empties: one interval.
        assert_eq!(asked_at(30), Duration::from_millis(100));
        // A stall: about as long as it has lasted.
        assert_eq!(asked_at(350), Duration::from_millis(350));
        // Sustained: the whole longest wait, never more.
        assert_eq!(asked_at(1_000), longest);
        assert_eq!(asked_at(60_000), longest);
        // It empties again: back to one interval.
        codel.saw_empty(start + Duration::from_millis(60_000));
        assert_eq!(asked_at(60_010), Duration::from_millis(100));
        // A longest wait under the interval never asks for less than it.
        assert_eq!(
            codel.retry_after(start + Duration::from_millis(61_000), Duration::ZERO),
            Duration::from_millis(100)
        );
    }

    #[test]
    fn an_older_empty_moment_never_moves_the_last_one_back() {
        let start = Instant::now();
        let codel = codel_at(start);
        codel.saw_empty(start + Duration::from_millis(300));
        codel.saw_empty(start + Duration::from_millis(10));
        assert_eq!(
            codel.wait_allowed(start + Duration::from_millis(350)),
            Duration::from_millis(100)
        );
    }

    fn config(workers: usize, queue_max: usize) -> AdmissionConfig {
        AdmissionConfig {
            workers: Some(workers),
            queue_max,
            target_ms: 5,
            interval_ms: 100,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn past_the_workers_a_request_waits_then_is_shed_and_a_freed_worker_admits_the_next() {
        let admission = Admission::new(&config(2, 10));
        let first = admission.admit("a").await.expect("a free worker");
        let _second = admission.admit("a").await.expect("a free worker");
        // Both busy: the third waits the interval (the queue emptied just
        // now), then is shed.
        assert_eq!(admission.admit("a").await.unwrap_err(), Shed::QueueDelay);
        // Still busy for more than an interval: a standing queue, and the
        // wait allowed drops to the target.
        tokio::time::advance(Duration::from_millis(150)).await;
        let started = Instant::now();
        assert_eq!(admission.admit("a").await.unwrap_err(), Shed::QueueDelay);
        assert_eq!(started.elapsed(), Duration::from_millis(5));
        drop(first);
        admission.admit("a").await.expect("the freed worker");
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_refuses_at_once() {
        let admission = Admission::new(&config(1, 1));
        let _busy = admission.admit("a").await.expect("a free worker");
        let waiting = {
            let admission = admission.clone();
            tokio::spawn(async move { admission.admit("a").await.map(drop) })
        };
        tokio::task::yield_now().await;
        assert_eq!(admission.admit("a").await.unwrap_err(), Shed::QueueFull);
        assert_eq!(waiting.await.expect("task").unwrap_err(), Shed::QueueDelay);
    }

    /// A request that gave its worker up (a waiter) is admitted again by
    /// the same rules: it waits as CoDel allows, is refused 503 overloaded
    /// when no worker frees in time, and holds the worker it gets.
    #[tokio::test(start_paused = true)]
    async fn readmission_takes_a_worker_or_is_shed_as_admission_sheds() {
        let admission = Admission::new(&config(1, 10));
        let readmission = Readmission {
            seat: Seat::new(admission.clone(), "a".to_owned(), None),
            retry_after_s: 3,
            in_flight: InFlightSlot::none(),
        };
        let busy = admission.admit("a").await.expect("a free worker");
        let shed = readmission.clone().admit().await.map(drop).unwrap_err();
        assert!(
            matches!(
                shed,
                ApiError::Overloaded {
                    retry_after_s: 3,
                    retry_after_ms: Some(100)
                }
            ),
            "{shed:?}"
        );
        drop(busy);
        let readmitted = readmission.admit().await.expect("the freed worker");
        assert_eq!(
            admission.admit("a").await.unwrap_err(),
            Shed::QueueDelay,
            "the readmitted request holds the only worker"
        );
        drop(readmitted);
        admission.admit("a").await.expect("given back");
    }

    fn seat_of(worker: &Worker) -> WorkerSeat {
        WorkerSeat {
            seat: Some(worker.seat.clone()),
        }
    }

    /// One worker: request "a" sets it aside for a carrier call during which
    /// "b" is admitted on it, and comes back on a borrowed one.
    async fn one_worker_lent_during_a_carrier_call() -> (Admission, Worker, Worker) {
        let admission = Admission::new(&config(1, 10));
        let carrier_caller = admission.admit("a").await.expect("a free worker");
        let other = seat_of(&carrier_caller)
            .set_aside_while(admission.admit("b"))
            .await
            .expect("the worker set aside serves another request");
        (admission, carrier_caller, other)
    }

    /// A request waiting on the carrier holds no worker, so another request
    /// runs meanwhile; coming back it takes a worker at once, ahead of the
    /// queue, and the workers in use return to the configured number once
    /// the borrowed one is repaid.
    #[tokio::test(start_paused = true)]
    async fn a_worker_set_aside_serves_another_request_and_comes_back_borrowed_then_repaid() {
        let (admission, carrier_caller, other) = one_worker_lent_during_a_carrier_call().await;
        // Back from the carrier with no worker free: borrowed, so new
        // requests wait until the debt is repaid.
        assert_eq!(admission.borrowed_unrepaid(), 1);
        assert_eq!(admission.admit("c").await.unwrap_err(), Shed::QueueDelay);
        drop(other);
        assert_eq!(
            admission.admit("c").await.unwrap_err(),
            Shed::QueueDelay,
            "the worker given back repaid the borrowed one"
        );
        drop(carrier_caller);
        assert_eq!(admission.borrowed_unrepaid(), 0);
        let next = admission.admit("c").await.expect("one worker again");
        assert_eq!(
            admission.admit("d").await.unwrap_err(),
            Shed::QueueDelay,
            "and only one"
        );
        drop(next);
        assert_eq!(admission.free_workers(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_borrowed_worker_given_back_first_cancels_its_own_debt() {
        let (admission, carrier_caller, other) = one_worker_lent_during_a_carrier_call().await;
        drop(carrier_caller);
        assert_eq!(admission.borrowed_unrepaid(), 0);
        assert_eq!(admission.free_workers(), 0, "b still holds the one worker");
        drop(other);
        assert_eq!(admission.free_workers(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn coming_back_with_a_free_worker_takes_it_from_the_pool() {
        let admission = Admission::new(&config(2, 10));
        let carrier_caller = admission.admit("a").await.expect("a free worker");
        seat_of(&carrier_caller).set_aside_while(async {}).await;
        assert_eq!(admission.borrowed_unrepaid(), 0);
        assert_eq!(admission.free_workers(), 1);
        drop(carrier_caller);
        assert_eq!(admission.free_workers(), 2);
    }

    /// Two requests queue behind the one worker; which one gets it when it
    /// is given back.
    async fn next_served_of_two_waiters(standing_first: bool) -> (bool, bool) {
        let admission = Admission::new(&AdmissionConfig {
            workers: Some(1),
            queue_max: 10,
            target_ms: 100,
            interval_ms: 100,
        });
        let busy = admission.admit("a").await.expect("a free worker");
        if standing_first {
            // Not empty for more than an interval: a standing queue.
            tokio::time::advance(Duration::from_millis(150)).await;
        }
        let spawn_waiter = || {
            let admission = admission.clone();
            tokio::spawn(async move { admission.admit("a").await })
        };
        let older = spawn_waiter();
        tokio::task::yield_now().await;
        let newer = spawn_waiter();
        tokio::task::yield_now().await;
        drop(busy);
        tokio::task::yield_now().await;
        let served = (older.is_finished(), newer.is_finished());
        older.abort();
        newer.abort();
        served
    }

    #[tokio::test(start_paused = true)]
    async fn a_queue_that_still_empties_serves_the_oldest_first_and_a_standing_one_the_newest() {
        assert_eq!(
            next_served_of_two_waiters(false).await,
            (true, false),
            "first come, first served"
        );
        assert_eq!(
            next_served_of_two_waiters(true).await,
            (false, true),
            "under a standing queue the newest waiter, whose client still waits"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_handed_to_a_request_that_stopped_waiting_goes_back_to_the_pool() {
        let admission = Admission::new(&config(1, 10));
        let busy = admission.admit("a").await.expect("a free worker");
        let waiter = {
            let admission = admission.clone();
            tokio::spawn(async move { admission.admit("a").await.map(drop) })
        };
        tokio::task::yield_now().await;
        // Handed over to the waiter, which is cut off before it reads it.
        drop(busy);
        waiter.abort();
        assert!(waiter.await.expect_err("aborted").is_cancelled());
        assert_eq!(admission.free_workers(), 1, "the worker is not lost");
        admission.admit("b").await.expect("and serves the next request");
    }

    /// A worker given back between a request's look for a free one and its
    /// entry into the queue (another thread's) is taken at the entry, not
    /// left free while the request waits.
    #[test]
    fn entering_the_queue_takes_a_worker_freed_meanwhile() {
        let pool = WorkerPool::new(&config(1, 10));
        assert!(
            QueuePlace::enter(&pool).expect("room").is_none(),
            "the free worker is taken"
        );
        let (free, held) = {
            let state = pool.lock();
            (state.free, state.held)
        };
        assert_eq!((free, held), (0, 1));
        let place = QueuePlace::enter(&pool).expect("room").expect("none free: queued");
        assert_eq!(pool.lock().waiters.len(), 1);
        drop(place);
        assert_eq!(pool.lock().waiters.len(), 0, "a place dropped leaves the queue");
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_never_waits_past_its_deadline() {
        let admission = Admission::new(&config(1, 10));
        let _busy = admission.admit("a").await.expect("a free worker");
        let seat = |deadline_ms: u64| {
            let deadline = Instant::now() + Duration::from_millis(deadline_ms);
            Seat::new(admission.clone(), "a".to_owned(), Some(deadline))
        };
        // Sooner than the interval CoDel would allow: shed at the deadline.
        let started = Instant::now();
        let shed = admission.admit_into(seat(30)).await.map(drop).unwrap_err();
        assert_eq!((shed, started.elapsed()), (Shed::Deadline, Duration::from_millis(30)));
        // Already passed: shed at once, without queueing.
        let shed = admission.admit_into(seat(0)).await.map(drop).unwrap_err();
        assert_eq!((shed, started.elapsed()), (Shed::Deadline, Duration::from_millis(30)));
        // Later than the interval: CoDel's wait is the limit.
        let shed = admission.admit_into(seat(1_000)).await.map(drop).unwrap_err();
        assert_eq!(shed, Shed::QueueDelay);
    }

    #[test]
    fn the_expected_work_time_is_a_running_mean_that_one_slow_request_moves_a_little() {
        let work_time = WorkTime::default();
        assert_eq!(work_time.expected(), Duration::ZERO, "no estimate before any work");
        work_time.record(Duration::from_millis(32));
        assert_eq!(work_time.expected(), Duration::from_millis(32), "the first sample");
        work_time.record(Duration::from_millis(48));
        assert_eq!(
            work_time.expected(),
            Duration::from_millis(33),
            "a sixteenth of the way"
        );
        // A carrier's 10 s timeout counts as WORK_TIME_SAMPLE_MAX.
        work_time.record(Duration::from_secs(10));
        assert_eq!(
            work_time.expected(),
            Duration::from_micros(33 * 15 * 1_000 / 16 + 1_000_000 / 16)
        );
        for _ in 0..200 {
            work_time.record(Duration::from_millis(5));
        }
        assert!(
            work_time.expected() < Duration::from_micros(5_100),
            "{:?}",
            work_time.expected()
        );
    }

    /// Work lately takes 40 ms: a request that must queue is admitted only
    /// while its deadline leaves 40 ms; with a worker free it is admitted
    /// whatever its deadline (the claim refuses one already passed).
    #[tokio::test(start_paused = true)]
    async fn a_queued_request_is_shed_once_its_deadline_leaves_less_than_the_work_takes() {
        let admission = Admission::new(&config(1, 10));
        admission.pool.work_time.record(Duration::from_millis(40));
        let seat = |deadline_ms: u64| {
            let deadline = Instant::now() + Duration::from_millis(deadline_ms);
            Seat::new(admission.clone(), "a".to_owned(), Some(deadline))
        };
        let free = admission.admit_into(seat(30)).await.expect("a free worker");
        // 50 ms left: it may wait 10 ms for a worker, then is shed.
        let started = Instant::now();
        let shed = admission.admit_into(seat(50)).await.map(drop).unwrap_err();
        assert_eq!((shed, started.elapsed()), (Shed::Deadline, Duration::from_millis(10)));
        // 30 ms left, less than the work takes: shed at once.
        let started = Instant::now();
        let shed = admission.admit_into(seat(30)).await.map(drop).unwrap_err();
        assert_eq!((shed, started.elapsed()), (Shed::Deadline, Duration::ZERO));
        // A worker freed within the time left admits the request.
        let waiting = admission.admit_into(seat(90));
        let freed = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            drop(free);
        };
        let (admitted, ()) = tokio::join!(waiting, freed);
        admitted.expect("admitted within its 50 ms to spare");
    }

    /// A client still waiting is told how long the queue has stood
    /// (`overloaded`, `Retry-After-Ms`), not a whole second; one whose
    /// deadline has passed is told `deadline_exceeded`.
    #[tokio::test(start_paused = true)]
    async fn a_deadline_shed_answers_overloaded_while_its_client_waits_and_deadline_exceeded_after() {
        let admission = Admission::new(&config(1, 10));
        admission.pool.work_time.record(Duration::from_millis(40));
        let seat = |deadline_ms: u64| {
            let deadline = Instant::now() + Duration::from_millis(deadline_ms);
            Seat::new(admission.clone(), "a".to_owned(), Some(deadline))
        };
        let _busy = admission.admit_into(seat(1_000)).await.expect("a free worker");
        let waiting = admit_or_shed(seat(30), 1).await.map(drop).unwrap_err();
        assert!(
            matches!(
                waiting,
                ApiError::Overloaded {
                    retry_after_s: 1,
                    retry_after_ms: Some(100)
                }
            ),
            "{waiting:?}"
        );
        let gone = admit_or_shed(seat(0), 1).await.map(drop).unwrap_err();
        assert!(
            matches!(
                gone,
                ApiError::Idempotency(IdempotencyError::DeadlineExceeded { retry_after_s: 1 })
            ),
            "{gone:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn one_caller_cannot_take_every_worker_from_another() {
        let admission = Admission::new(&config(4, 100));
        // Alone, a caller may use every worker.
        let mut held: Vec<Worker> = Vec::new();
        for _ in 0..3 {
            held.push(admission.admit("greedy").await.expect("free worker"));
        }
        let _modest = admission.admit("modest").await.expect("the last free worker");
        // Contended, two holders: the greedy caller holds 3 of 4, over its
        // share of 2, and is refused without queueing; the modest one queues.
        assert_eq!(admission.admit("greedy").await.unwrap_err(), Shed::CallerShare);
        let modest_waits = {
            let admission = admission.clone();
            tokio::spawn(async move { admission.admit("modest").await.map(drop) })
        };
        tokio::task::yield_now().await;
        held.pop();
        modest_waits
            .await
            .expect("task")
            .expect("a worker freed by the greedy caller");
    }
}
