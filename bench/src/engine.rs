//! The load engine: open-loop arrivals at a target rate (latency from each
//! operation's intended start, coordinated omission corrected as wrk2 does),
//! and a closed-loop saturation run for the raw-rate comparisons.
//!
//! The engine knows nothing of stores or HTTP: a [`Workload`] turns an
//! operation number into a future that reports an [`Outcome`].
//!
//! A requested stop ([`crate::interrupt`]) ends a run early: no operation
//! starts after it, those running get until the interrupt's drain deadline,
//! and the result's `plan.duration` is the measured time actually run.

use crate::interrupt::{self, INTERRUPT_POLL_MS, Interrupt};
use crate::progress::LiveProgress;
use crate::recorder::{Outcome, Recording};
use crate::schedule::{Arrivals, Schedule, ScheduleError, arrivals_within};
use futures::future::BoxFuture;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::runtime::Handle;
use tokio::sync::Semaphore;
use tokio::task::AbortHandle;

/// Default bound on operations in flight at once. Past it, the next
/// operation waits for a free slot (and is counted as started late); its
/// latency still runs from its intended start.
pub const INFLIGHT_MAX_DEFAULT: usize = 10_000;
/// Largest in-flight bound accepted.
pub const INFLIGHT_MAX_LIMIT: usize = 1_000_000;
/// Default time allowed after the last intended start for the operations
/// still running to finish; those that do not are recorded as `unfinished`.
pub const DRAIN_MS_DEFAULT: u64 = 10_000;
/// Pause between planning a run and its first intended start, so the
/// dispatcher thread is running before the clock starts.
const START_DELAY_MS: u64 = 20;
/// Default number of concurrent workers in a closed-loop saturation run.
pub const CONCURRENCY_DEFAULT: usize = 64;
/// Largest closed-loop concurrency accepted.
pub const CONCURRENCY_MAX: usize = 10_000;

/// Turns operation numbers into work. Each operation must be independent of
/// the others' timing: the engine starts them on schedule whatever happens.
pub trait Workload: Send + Sync + 'static {
    fn operation(&self, index: u64) -> BoxFuture<'static, Outcome>;

    /// Waits until work the operations left running in the background has
    /// ended (an http intent's second copy, its retries), so that the next
    /// run starts on an idle target. Most workloads leave nothing behind.
    fn settle(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// One open-loop run.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadPlan {
    pub rate_per_s: f64,
    pub arrivals: Arrivals,
    pub warmup: Duration,
    pub duration: Duration,
    /// Seed of the Poisson schedule.
    pub seed: u64,
    pub inflight_max: usize,
    pub drain: Duration,
    /// Added to every operation number, so that consecutive runs against one
    /// store (ramp steps) use fresh intents.
    pub index_base: u64,
    /// Shown before the progress bar.
    pub label: String,
    pub show_progress: bool,
}

/// Why a plan was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    #[error("in-flight bound must be 1 to {INFLIGHT_MAX_LIMIT}, got {0}")]
    InflightMax(usize),
    #[error("duration must be at least 1 s")]
    Duration,
    #[error("concurrency must be 1 to {CONCURRENCY_MAX}, got {0}")]
    Concurrency(usize),
}

impl LoadPlan {
    pub fn validate(&self) -> Result<(), PlanError> {
        Schedule::new(self.arrivals, self.rate_per_s, self.seed)?;
        if !(1..=INFLIGHT_MAX_LIMIT).contains(&self.inflight_max) {
            return Err(PlanError::InflightMax(self.inflight_max));
        }
        if self.duration < Duration::from_secs(1) {
            return Err(PlanError::Duration);
        }
        Ok(())
    }
}

/// What an open-loop run measured.
#[derive(Debug, Clone)]
pub struct OpenLoopResult {
    /// The plan as run: an interrupted run's `duration` is the part of the
    /// measured window it reached.
    pub plan: LoadPlan,
    pub recording: Recording,
    /// Operations meant to start in the measured window.
    pub intended: u64,
    /// Operations that found every in-flight slot taken and had to wait.
    pub started_late: u64,
    /// Operations never started before the drain deadline; recorded as
    /// failures with their latency so far.
    pub not_sent: u64,
    /// Operations still running at the drain deadline; recorded the same way.
    pub unfinished: u64,
}

/// The state shared by the dispatcher, the operations and the progress bar.
pub struct Shared {
    recording: Mutex<Recording>,
    /// Running operations by number: intended start and a handle to stop them.
    running: Mutex<HashMap<u64, (Instant, AbortHandle)>>,
    pub started: AtomicU64,
}

impl Shared {
    fn new(measured_start: Instant) -> Self {
        Self {
            recording: Mutex::new(Recording::new(measured_start)),
            running: Mutex::new(HashMap::new()),
            started: AtomicU64::new(0),
        }
    }

    /// The recording; a panic elsewhere while holding the lock leaves plain
    /// counters behind, which are still sound to read.
    pub fn recording(&self) -> MutexGuard<'_, Recording> {
        self.recording.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn running(&self) -> MutexGuard<'_, HashMap<u64, (Instant, AbortHandle)>> {
        self.running.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn in_flight(&self) -> usize {
        self.running().len()
    }

    /// Records a finished operation, unless the drain deadline already
    /// recorded it as unfinished (it is then no longer in `running`).
    fn finish(&self, index: u64, intended: Instant, outcome: Outcome) {
        let completed = Instant::now();
        let was_running = self.running().remove(&index).is_some();
        if was_running {
            self.recording().record(intended, completed, outcome);
        }
    }
}

/// Runs `workload` open-loop as `plan` says and returns what it measured;
/// a stop requested of the process ends it early.
pub async fn run_open_loop(plan: &LoadPlan, workload: Arc<dyn Workload>) -> Result<OpenLoopResult, PlanError> {
    run_open_loop_until(plan, workload, interrupt::global()).await
}

/// [`run_open_loop`], ended early by a stop requested of `interrupt`.
pub async fn run_open_loop_until(
    plan: &LoadPlan,
    workload: Arc<dyn Workload>,
    interrupt: &'static Interrupt,
) -> Result<OpenLoopResult, PlanError> {
    plan.validate()?;
    let start = Instant::now() + Duration::from_millis(START_DELAY_MS);
    let measured_start = start + plan.warmup;
    let schedule_end = measured_start + plan.duration;
    let deadline = schedule_end + plan.drain;
    let shared = Arc::new(Shared::new(measured_start));
    let progress = LiveProgress::start(plan, shared.clone(), start);
    let dispatcher = Dispatcher {
        plan: plan.clone(),
        workload,
        shared: shared.clone(),
        slots: Arc::new(Semaphore::new(plan.inflight_max)),
        handle: Handle::current(),
        start,
        deadline,
        interrupt,
    };
    let slots = dispatcher.slots.clone();
    let dispatched = tokio::task::spawn_blocking(move || dispatcher.run())
        .await
        .unwrap_or_default();
    // Every operation holds one slot until it ends: all slots back means all
    // operations are done.
    let all = u32::try_from(plan.inflight_max).unwrap_or(u32::MAX);
    let drained = interrupt.until_drained(slots.acquire_many(all));
    let _ = tokio::time::timeout_at(deadline.into(), drained).await;
    let unfinished = close_and_record_unfinished(&shared);
    progress.finish();
    let recording = shared.recording().clone();
    let duration = match dispatched.stopped_at {
        Some(stopped_at) => measured_until(measured_start, stopped_at).min(plan.duration),
        None => plan.duration,
    };
    Ok(OpenLoopResult {
        plan: LoadPlan {
            duration,
            ..plan.clone()
        },
        recording,
        intended: dispatched.intended,
        started_late: dispatched.started_late,
        not_sent: dispatched.not_sent,
        unfinished,
    })
}

/// Stops the operations still running at the deadline and records each as a
/// failure whose latency is at least its time so far: leaving them out would
/// hide exactly the slowest operations.
fn close_and_record_unfinished(shared: &Shared) -> u64 {
    let mut running = shared.running();
    let now = Instant::now();
    let mut recording = shared.recording();
    let mut unfinished = 0;
    for (_, (intended, abort)) in running.drain() {
        abort.abort();
        recording.record(intended, now, Outcome::failure("unfinished"));
        if intended >= recording.measured_start {
            unfinished += 1;
        }
    }
    unfinished
}

/// The measured time from `measured_start` to an early stop; at least a
/// millisecond, so that rates over it stay finite.
fn measured_until(measured_start: Instant, stopped_at: Instant) -> Duration {
    const MEASURED_MS_MIN: u64 = 1;
    stopped_at
        .saturating_duration_since(measured_start)
        .max(Duration::from_millis(MEASURED_MS_MIN))
}

#[derive(Debug, Default)]
struct Dispatched {
    intended: u64,
    started_late: u64,
    not_sent: u64,
    /// When a requested stop ended the schedule early.
    stopped_at: Option<Instant>,
}

/// Starts operations at their intended times, from a thread of its own:
/// `std::thread::sleep` wakes within tens of microseconds, where tokio's
/// timer works in whole milliseconds and would add up to a millisecond of
/// start lag to every operation.
struct Dispatcher {
    plan: LoadPlan,
    workload: Arc<dyn Workload>,
    shared: Arc<Shared>,
    slots: Arc<Semaphore>,
    handle: Handle,
    start: Instant,
    deadline: Instant,
    interrupt: &'static Interrupt,
}

impl Dispatcher {
    fn run(self) -> Dispatched {
        let mut dispatched = Dispatched::default();
        let measured_start = self.start + self.plan.warmup;
        let Ok(schedule) = Schedule::new(self.plan.arrivals, self.plan.rate_per_s, self.plan.seed) else {
            return dispatched;
        };
        for arrival in arrivals_within(schedule, self.plan.warmup + self.plan.duration) {
            let intended = self.start + arrival.offset;
            if !self.sleep_until(intended) {
                dispatched.stopped_at = Some(Instant::now());
                break;
            }
            let measured = intended >= measured_start;
            dispatched.intended += u64::from(measured);
            let Some((permit, waited)) = self.take_slot() else {
                self.record_not_sent(intended);
                dispatched.not_sent += u64::from(measured);
                continue;
            };
            dispatched.started_late += u64::from(waited && measured);
            self.start_operation(self.plan.index_base + arrival.index, intended, permit);
        }
        dispatched
    }

    /// Sleeps until `intended`, looking at the interrupt every
    /// [`INTERRUPT_POLL_MS`]; false when a stop was requested.
    fn sleep_until(&self, intended: Instant) -> bool {
        loop {
            if self.interrupt.is_requested() {
                return false;
            }
            let now = Instant::now();
            if intended <= now {
                return true;
            }
            std::thread::sleep((intended - now).min(Duration::from_millis(INTERRUPT_POLL_MS)));
        }
    }

    /// A free in-flight slot, waiting for one until the deadline (or a
    /// requested stop) if all are taken. Returns the permit and whether it
    /// had to wait.
    fn take_slot(&self) -> Option<(tokio::sync::OwnedSemaphorePermit, bool)> {
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            return Some((permit, false));
        }
        if Instant::now() >= self.deadline {
            return None;
        }
        let acquire = self.slots.clone().acquire_owned();
        let wait = tokio::time::timeout_at(self.deadline.into(), async {
            tokio::select! {
                permit = acquire => permit.ok(),
                () = self.interrupt.requested() => None,
            }
        });
        self.handle.block_on(wait).ok().flatten().map(|permit| (permit, true))
    }

    fn record_not_sent(&self, intended: Instant) {
        let now = Instant::now();
        self.shared
            .recording()
            .record(intended, now, Outcome::failure("not_sent"));
    }

    fn start_operation(&self, index: u64, intended: Instant, permit: tokio::sync::OwnedSemaphorePermit) {
        let started = Instant::now();
        let workload = self.workload.clone();
        let shared = self.shared.clone();
        // The map is locked across the spawn so the operation cannot finish
        // (and try to remove itself) before it has been added. The operation
        // is built inside its task, on the runtime, so workloads may spawn.
        let mut running = self.shared.running();
        let task = self.handle.spawn(async move {
            let outcome = workload.operation(index).await;
            shared.finish(index, intended, outcome);
            drop(permit);
        });
        running.insert(index, (intended, task.abort_handle()));
        drop(running);
        self.shared.started.fetch_add(1, Ordering::Relaxed);
        self.shared.recording().record_start_lag(intended, started);
    }
}

/// One closed-loop saturation run: `concurrency` workers each start the
/// next operation as soon as the previous one ends. This measures the
/// highest rate a target sustains, for comparison with a raw baseline run
/// the same way; its latencies are not open-loop latencies.
#[derive(Debug, Clone, PartialEq)]
pub struct SaturationPlan {
    pub concurrency: usize,
    pub warmup: Duration,
    pub duration: Duration,
    pub index_base: u64,
    pub label: String,
    pub show_progress: bool,
}

/// What a saturation run measured; latency runs from each operation's
/// actual start.
#[derive(Debug, Clone)]
pub struct SaturationResult {
    /// The plan as run: an interrupted run's `duration` is the part of the
    /// measured window it reached.
    pub plan: SaturationPlan,
    pub recording: Recording,
}

/// Runs `workload` closed-loop as `plan` says; a stop requested of the
/// process ends it early (each worker finishes the operation it is in).
pub async fn run_saturation(plan: &SaturationPlan, workload: Arc<dyn Workload>) -> Result<SaturationResult, PlanError> {
    run_saturation_until(plan, workload, interrupt::global()).await
}

/// [`run_saturation`], ended early by a stop requested of `interrupt`.
pub async fn run_saturation_until(
    plan: &SaturationPlan,
    workload: Arc<dyn Workload>,
    interrupt: &'static Interrupt,
) -> Result<SaturationResult, PlanError> {
    if !(1..=CONCURRENCY_MAX).contains(&plan.concurrency) {
        return Err(PlanError::Concurrency(plan.concurrency));
    }
    if plan.duration < Duration::from_secs(1) {
        return Err(PlanError::Duration);
    }
    let start = Instant::now();
    let measured_start = start + plan.warmup;
    let end = measured_start + plan.duration;
    let shared = Arc::new(Shared::new(measured_start));
    let progress = LiveProgress::start_saturation(plan, shared.clone(), start);
    let next_index = Arc::new(AtomicU64::new(plan.index_base));
    let workers: Vec<_> = (0..plan.concurrency)
        .map(|_| {
            tokio::spawn(saturation_worker(
                workload.clone(),
                shared.clone(),
                next_index.clone(),
                end,
                interrupt,
            ))
        })
        .collect();
    for worker in workers {
        let _ = worker.await;
    }
    progress.finish();
    let recording = shared.recording().clone();
    let duration = match interrupt.interruption() {
        Some(_) => measured_until(measured_start, Instant::now()).min(plan.duration),
        None => plan.duration,
    };
    Ok(SaturationResult {
        plan: SaturationPlan {
            duration,
            ..plan.clone()
        },
        recording,
    })
}

async fn saturation_worker(
    workload: Arc<dyn Workload>,
    shared: Arc<Shared>,
    next_index: Arc<AtomicU64>,
    end: Instant,
    interrupt: &'static Interrupt,
) {
    while Instant::now() < end && !interrupt.is_requested() {
        let index = next_index.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        shared.started.fetch_add(1, Ordering::Relaxed);
        let outcome = workload.operation(index).await;
        shared.recording().record(started, Instant::now(), outcome);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sleeps `normal` per operation, except that operation `stalled` takes
    /// `stall`: a server that freezes once.
    struct Sleeper {
        normal: Duration,
        stalled: u64,
        stall: Duration,
    }

    impl Workload for Sleeper {
        fn operation(&self, index: u64) -> BoxFuture<'static, Outcome> {
            let pause = if index == self.stalled { self.stall } else { self.normal };
            Box::pin(async move {
                tokio::time::sleep(pause).await;
                Outcome::success("ok")
            })
        }
    }

    fn plan(rate_per_s: f64, inflight_max: usize) -> LoadPlan {
        LoadPlan {
            rate_per_s,
            arrivals: Arrivals::Fixed,
            warmup: Duration::ZERO,
            duration: Duration::from_secs(1),
            seed: 1,
            inflight_max,
            drain: Duration::from_secs(5),
            index_base: 0,
            label: "test".into(),
            show_progress: false,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_intended_operation_runs_once_and_is_counted() {
        let workload = Arc::new(Sleeper {
            normal: Duration::from_millis(1),
            stalled: u64::MAX,
            stall: Duration::ZERO,
        });
        let result = run_open_loop(&plan(200.0, 100), workload).await.unwrap();
        assert_eq!(result.intended, 200);
        assert_eq!(result.recording.completed(), 200);
        assert_eq!(result.recording.outcomes.get("ok"), Some(&200));
        assert_eq!((result.not_sent, result.unfinished), (0, 0));
    }

    /// With one in-flight slot, a 300 ms stall holds back every operation
    /// meant to start during it. A closed-loop tester would record one slow
    /// operation; measured from intended starts, the held-back operations
    /// each carry their wait, so many of them are slow, and the wait for
    /// the slot is counted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn latency_runs_from_the_intended_start_through_a_stall() {
        let workload = Arc::new(Sleeper {
            normal: Duration::from_micros(100),
            stalled: 10,
            stall: Duration::from_millis(300),
        });
        let result = run_open_loop(&plan(100.0, 1), workload).await.unwrap();
        assert_eq!(result.recording.completed(), 100);
        let slow = result
            .recording
            .latency
            .iter_recorded()
            .filter(|value| value.value_iterated_to() >= 100_000)
            .map(|value| value.count_at_value())
            .sum::<u64>();
        // Operations 10 to 29 were meant to start during the stall; at least
        // 20 ms x 10 of them waited 100 ms or more.
        assert!(slow >= 15, "only {slow} slow operations");
        assert!(result.started_late >= 20, "{}", result.started_late);
        assert!(result.recording.latency.max() >= 300_000);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn operations_that_outlive_the_drain_are_recorded_as_unfinished() {
        let workload = Arc::new(Sleeper {
            normal: Duration::from_millis(1),
            stalled: 5,
            stall: Duration::from_secs(30),
        });
        let mut plan = plan(20.0, 100);
        plan.drain = Duration::from_millis(200);
        let result = run_open_loop(&plan, workload).await.unwrap();
        assert_eq!(result.unfinished, 1);
        assert_eq!(result.recording.outcomes.get("unfinished"), Some(&1));
        assert_eq!(result.recording.completed(), 20);
    }

    /// A stop requested a moment into a minute-long run: nothing starts
    /// after it, the operation stuck in flight is given up on at the drain
    /// deadline (recorded as unfinished), and the result's duration is the
    /// time actually run.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_requested_stop_ends_the_run_and_bounds_the_wait_for_operations_in_flight() {
        let interrupt: &'static Interrupt = Box::leak(Box::new(Interrupt::with_drain(Duration::from_millis(100))));
        let workload = Arc::new(Sleeper {
            normal: Duration::from_millis(1),
            stalled: 2,
            stall: Duration::from_secs(600),
        });
        let mut plan = plan(20.0, 100);
        plan.duration = Duration::from_secs(60);
        plan.drain = Duration::from_secs(60);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            interrupt.request(crate::interrupt::InterruptSignal::Interrupt);
        });
        let run = run_open_loop_until(&plan, workload, interrupt);
        let result = tokio::time::timeout(Duration::from_secs(30), run)
            .await
            .expect("the run ends soon after the stop")
            .unwrap();
        assert!(
            result.plan.duration < Duration::from_secs(30),
            "{:?}",
            result.plan.duration
        );
        assert!(result.intended < 600, "{} of 1,200 started", result.intended);
        assert_eq!(result.unfinished, 1);
        assert_eq!(result.recording.completed(), result.intended);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_saturation_run_keeps_each_worker_busy() {
        let workload = Arc::new(Sleeper {
            normal: Duration::from_millis(10),
            stalled: u64::MAX,
            stall: Duration::ZERO,
        });
        let plan = SaturationPlan {
            concurrency: 4,
            warmup: Duration::ZERO,
            duration: Duration::from_secs(1),
            index_base: 0,
            label: "test".into(),
            show_progress: false,
        };
        let result = run_saturation(&plan, workload).await.unwrap();
        // Four workers at about 10 ms each: up to 400 in one second, fewer
        // when the machine is busy; never more.
        let completed = result.recording.completed();
        assert!((40..=404).contains(&completed), "{completed}");
    }
}
