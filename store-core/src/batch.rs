//! Group commit in the application: operations that arrive while a batch is
//! in flight are sent together as the next batch.
//!
//! A backend whose every write pays a round trip and a durable commit (a
//! PostgreSQL statement, a WAL flush) spends most of that cost once per
//! batch rather than once per item. [`Batcher`] collects the items; the
//! backend's [`BatchRunner`] turns one batch into one statement (or one
//! pipeline) and answers an outcome per item.
//!
//! - **No timer, no added latency at idle.** An item that finds a lane free
//!   starts a batch at once: at low load every batch holds one item. Items
//!   that arrive while every lane is busy queue, and the next lane to finish
//!   takes all of them (up to [`BatchLimits::items_max`]) as its next batch,
//!   so batches grow with the load and never wait for a clock.
//! - **Bounded.** At most `items_max` items per batch, at most
//!   `queued_items_max` items waiting; past that [`Batcher::submit`] answers
//!   [`BatchError::QueueFull`] at once and the item is not queued.
//! - **An outcome per item.** The runner answers one outcome for each item,
//!   in order (asserted); an item's failure is its outcome, so it never fails
//!   the others.
//! - **Dropping a caller's future** never touches another item: a batch runs
//!   in a task of its own, and the caller only waits for its reply. An item
//!   whose caller left before its batch began is skipped (it was never sent);
//!   one already sent completes as if the caller were there, as a statement
//!   the caller had sent itself would.
//! - **Several batches in flight.** A small, named number of lanes
//!   ([`BatchLimits::in_flight_max`]) may each run a batch at once. One lane
//!   would hold every item behind the previous batch's whole round trip and
//!   commit, and leave a backend's other connections idle; with two, one
//!   batch is built and sent while the other waits for its flush, and the
//!   database can fold both commits into one WAL flush of its own. More
//!   lanes split the same load into smaller batches again, which is what
//!   batching exists to avoid: the count stays small.
//! - **A lane that dies** (its runner panicked, or the runtime shut down
//!   under it) answers [`BatchError::Lost`] to the items of its batch; if it
//!   was the last lane, to every queued item too, so no caller waits for a
//!   lane that will never come. A backend treats `Lost` as "not decided" and
//!   takes its unbatched path, which is safe because each item's write is
//!   fenced by its own token and repeating it is harmless.

use async_trait::async_trait;
use std::collections::{HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tokio::sync::oneshot;

/// Largest batch size accepted: a backend's statement carries every item of
/// a batch as array parameters, and a bound keeps one statement's size and
/// lock count small.
pub const BATCH_ITEMS_MAX: usize = 1_024;
/// Largest queue accepted.
pub const BATCH_QUEUED_ITEMS_MAX: usize = 65_536;
/// Most lanes accepted (see the module documentation for why few).
pub const BATCHES_IN_FLIGHT_MAX: usize = 16;

/// The bounds of one [`Batcher`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    items_max: usize,
    queued_items_max: usize,
    in_flight_max: usize,
}

/// A [`BatchLimits`] that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidBatchLimits {
    #[error("a batch size of {0} is outside 1..={BATCH_ITEMS_MAX}")]
    ItemsMax(usize),
    #[error("a queue bound of {0} is outside 1..={BATCH_QUEUED_ITEMS_MAX}")]
    QueuedItemsMax(usize),
    #[error("{0} batches in flight is outside 1..={BATCHES_IN_FLIGHT_MAX}")]
    InFlightMax(usize),
}

impl BatchLimits {
    pub fn new(items_max: usize, queued_items_max: usize, in_flight_max: usize) -> Result<Self, InvalidBatchLimits> {
        if !(1..=BATCH_ITEMS_MAX).contains(&items_max) {
            return Err(InvalidBatchLimits::ItemsMax(items_max));
        }
        if !(1..=BATCH_QUEUED_ITEMS_MAX).contains(&queued_items_max) {
            return Err(InvalidBatchLimits::QueuedItemsMax(queued_items_max));
        }
        if !(1..=BATCHES_IN_FLIGHT_MAX).contains(&in_flight_max) {
            return Err(InvalidBatchLimits::InFlightMax(in_flight_max));
        }
        Ok(Self {
            items_max,
            queued_items_max,
            in_flight_max,
        })
    }

    /// Items in one batch at most.
    pub fn items_max(&self) -> usize {
        self.items_max
    }

    /// Items waiting for a lane at most.
    pub fn queued_items_max(&self) -> usize {
        self.queued_items_max
    }

    /// Batches running at once at most.
    pub fn in_flight_max(&self) -> usize {
        self.in_flight_max
    }
}

/// Why [`Batcher::submit`] has no outcome for an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    /// The queue was full: the item was refused before it was queued, so
    /// nothing was done for it.
    #[error("{queued_items_max} items are already waiting for a batch")]
    QueueFull { queued_items_max: usize },
    /// The lane that took the item ended without answering (its runner
    /// panicked, or the runtime shut down): the item may or may not have
    /// been applied.
    #[error("the batch that took the item ended without an outcome for it")]
    Lost,
}

/// Runs one batch: a backend's statement over every item.
#[async_trait]
pub trait BatchRunner: Send + Sync + 'static {
    type Item: Send + 'static;
    type Outcome: Send + 'static;

    /// Exactly one outcome per item, in the items' order. An item's failure
    /// belongs in its outcome, never in another's.
    async fn run(&self, items: Vec<Self::Item>) -> Vec<Self::Outcome>;
}

/// The indices of the items that go into a batch's one statement or
/// transaction: each key's first item, in the items' order. A key's later
/// items stay out and go alone once the batch has committed, so they see
/// its first item's write exactly as if they had come one after the other
/// (a statement or a transaction cannot apply two writes of one key in
/// order: it would decide both on the record as it was before either).
pub fn first_item_of_each_key<K: Eq + Hash>(keys: impl IntoIterator<Item = K>) -> Vec<usize> {
    let mut seen = HashSet::new();
    keys.into_iter()
        .enumerate()
        .filter_map(|(index, key)| seen.insert(key).then_some(index))
        .collect()
}

/// One queued item and where its outcome goes.
struct Pending<I, O> {
    item: I,
    reply: oneshot::Sender<O>,
}

struct State<I, O> {
    queue: VecDeque<Pending<I, O>>,
    /// Lanes running a batch (or about to take one).
    in_flight: usize,
}

struct Shared<R: BatchRunner> {
    runner: R,
    limits: BatchLimits,
    state: Mutex<State<R::Item, R::Outcome>>,
}

impl<R: BatchRunner> Shared<R> {
    fn lock(&self) -> MutexGuard<'_, State<R::Item, R::Outcome>> {
        // Nothing panics while the lock is held, so a poisoned state is
        // still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Collects items into batches for one [`BatchRunner`]. Cheap to clone:
/// clones share the queue and the lanes.
pub struct Batcher<R: BatchRunner> {
    shared: Arc<Shared<R>>,
}

impl<R: BatchRunner> Clone for Batcher<R> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<R: BatchRunner> std::fmt::Debug for Batcher<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.shared.lock();
        f.debug_struct("Batcher")
            .field("limits", &self.shared.limits)
            .field("queued", &state.queue.len())
            .field("in_flight", &state.in_flight)
            .finish()
    }
}

impl<R: BatchRunner> Batcher<R> {
    pub fn new(runner: R, limits: BatchLimits) -> Self {
        let state = State {
            queue: VecDeque::new(),
            in_flight: 0,
        };
        Self {
            shared: Arc::new(Shared {
                runner,
                limits,
                state: Mutex::new(state),
            }),
        }
    }

    pub fn limits(&self) -> BatchLimits {
        self.shared.limits
    }

    /// The item's outcome, once the batch that took it has run. Must be
    /// called inside a tokio runtime: a free lane starts a task there.
    pub async fn submit(&self, item: R::Item) -> Result<R::Outcome, BatchError> {
        let (reply, answer) = oneshot::channel();
        let start_lane = {
            let mut state = self.shared.lock();
            let queued_items_max = self.shared.limits.queued_items_max;
            if state.queue.len() >= queued_items_max {
                return Err(BatchError::QueueFull { queued_items_max });
            }
            state.queue.push_back(Pending { item, reply });
            let free = state.in_flight < self.shared.limits.in_flight_max;
            if free {
                state.in_flight += 1;
            }
            free
        };
        if start_lane {
            // The guard is made before the task, so a task dropped before
            // its first poll still gives its lane back.
            let lane = Lane {
                shared: Arc::clone(&self.shared),
                given_back: false,
            };
            tokio::spawn(lane.run());
        }
        answer.await.map_err(|_| BatchError::Lost)
    }
}

/// One lane: runs batches while items are queued, then gives itself back.
/// Dropped before it gave itself back (a panic, a runtime shut down), it
/// gives the lane back in `Drop`.
struct Lane<R: BatchRunner> {
    shared: Arc<Shared<R>>,
    /// Set once `next_batch` has given the lane back.
    given_back: bool,
}

impl<R: BatchRunner> Lane<R> {
    async fn run(mut self) {
        while let Some(batch) = self.next_batch() {
            let (items, replies): (Vec<_>, Vec<_>) =
                batch.into_iter().map(|pending| (pending.item, pending.reply)).unzip();
            let sent = items.len();
            let outcomes = self.shared.runner.run(items).await;
            assert_eq!(outcomes.len(), sent, "a batch runner answers one outcome per item");
            for (reply, outcome) in replies.into_iter().zip(outcomes) {
                // A caller that has gone no longer wants its outcome.
                let _ = reply.send(outcome);
            }
        }
        self.given_back = true;
    }

    /// Takes up to `items_max` queued items whose callers still wait; `None`
    /// (having given the lane back, under the same lock that `submit` queues
    /// under, so no item is left without a lane) when none are queued.
    fn next_batch(&self) -> Option<Vec<Pending<R::Item, R::Outcome>>> {
        let mut state = self.shared.lock();
        let mut batch = Vec::new();
        while batch.len() < self.shared.limits.items_max {
            let Some(pending) = state.queue.pop_front() else {
                break;
            };
            if !pending.reply.is_closed() {
                batch.push(pending);
            }
        }
        if batch.is_empty() {
            assert!(state.in_flight > 0, "a running lane is counted in flight");
            state.in_flight -= 1;
            return None;
        }
        Some(batch)
    }
}

impl<R: BatchRunner> Drop for Lane<R> {
    fn drop(&mut self) {
        if self.given_back {
            return;
        }
        // The lane did not end normally. Its own batch's replies were
        // dropped with it (their callers see `Lost`).
        let stranded = {
            let mut state = self.shared.lock();
            assert!(state.in_flight > 0, "a dying lane is counted in flight");
            state.in_flight -= 1;
            if state.in_flight == 0 {
                std::mem::take(&mut state.queue)
            } else {
                VecDeque::new()
            }
        };
        // Dropped outside the lock: their callers see `Lost` rather than
        // wait for a lane that no submit may ever start.
        drop(stranded);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::sync::Semaphore;

    /// Records each batch, may hold batches at a gate, and answers each
    /// item (a number) with itself doubled, or an error for odd numbers.
    struct Recording {
        batches: Mutex<Vec<Vec<u32>>>,
        gate: Arc<Semaphore>,
        running: AtomicUsize,
        running_max: AtomicUsize,
    }

    impl Recording {
        fn gated() -> (Self, Arc<Semaphore>) {
            let gate = Arc::new(Semaphore::new(0));
            let runner = Self {
                batches: Mutex::new(Vec::new()),
                gate: Arc::clone(&gate),
                running: AtomicUsize::new(0),
                running_max: AtomicUsize::new(0),
            };
            (runner, gate)
        }
    }

    #[async_trait]
    impl BatchRunner for Recording {
        type Item = u32;
        type Outcome = Result<u32, String>;

        async fn run(&self, items: Vec<u32>) -> Vec<Result<u32, String>> {
            let running = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.running_max.fetch_max(running, Ordering::SeqCst);
            self.batches.lock().unwrap().push(items.clone());
            assert!(!items.contains(&666), "the runner fails on item 666");
            self.gate.acquire().await.expect("gate open").forget();
            self.running.fetch_sub(1, Ordering::SeqCst);
            items
                .into_iter()
                .map(|item| {
                    if item % 2 == 1 {
                        Err(format!("item {item} is odd"))
                    } else {
                        Ok(item * 2)
                    }
                })
                .collect()
        }
    }

    fn batches(batcher: &Batcher<Recording>) -> Vec<Vec<u32>> {
        batcher.shared.runner.batches.lock().unwrap().clone()
    }

    fn limits(items_max: usize, queued_items_max: usize, in_flight_max: usize) -> BatchLimits {
        BatchLimits::new(items_max, queued_items_max, in_flight_max).expect("valid limits")
    }

    /// Lets the spawned lanes run until every one waits at the gate.
    async fn settle() {
        for _ in 0..16 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_item_at_idle_is_a_batch_of_one_sent_at_once() {
        let (runner, gate) = Recording::gated();
        gate.add_permits(1);
        let batcher = Batcher::new(runner, limits(8, 64, 1));
        let started = tokio::time::Instant::now();
        assert_eq!(batcher.submit(4).await, Ok(Ok(8)));
        assert_eq!(started.elapsed(), std::time::Duration::ZERO, "no timer");
        assert_eq!(batches(&batcher), vec![vec![4]]);
    }

    #[tokio::test(start_paused = true)]
    async fn items_that_arrive_during_a_batch_go_together_in_the_next() {
        let (runner, gate) = Recording::gated();
        let batcher = Batcher::new(runner, limits(8, 64, 1));
        let first = tokio::spawn({
            let batcher = batcher.clone();
            async move { batcher.submit(2).await }
        });
        settle().await;
        let later: Vec<_> = [10, 12, 14]
            .into_iter()
            .map(|item| {
                let batcher = batcher.clone();
                tokio::spawn(async move { batcher.submit(item).await })
            })
            .collect();
        settle().await;
        assert_eq!(batches(&batcher), vec![vec![2]], "the later items wait for the lane");
        gate.add_permits(2);
        assert_eq!(first.await.unwrap(), Ok(Ok(4)));
        for (task, expected) in later.into_iter().zip([20, 24, 28]) {
            assert_eq!(task.await.unwrap(), Ok(Ok(expected)));
        }
        assert_eq!(batches(&batcher), vec![vec![2], vec![10, 12, 14]]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_never_holds_more_than_its_maximum() {
        let (runner, gate) = Recording::gated();
        let batcher = Batcher::new(runner, limits(3, 64, 1));
        let first = tokio::spawn({
            let batcher = batcher.clone();
            async move { batcher.submit(0).await }
        });
        settle().await;
        let tasks: Vec<_> = (1..8u32)
            .map(|item| {
                let batcher = batcher.clone();
                tokio::spawn(async move { batcher.submit(item * 2).await })
            })
            .collect();
        settle().await;
        gate.add_permits(100);
        assert_eq!(first.await.unwrap(), Ok(Ok(0)));
        for task in tasks {
            assert!(matches!(task.await.unwrap(), Ok(Ok(_))));
        }
        let sizes: Vec<usize> = batches(&batcher).iter().map(Vec::len).collect();
        assert_eq!(sizes.iter().sum::<usize>(), 8);
        assert!(sizes.iter().all(|&size| size <= 3), "{sizes:?}");
        assert_eq!(
            sizes,
            vec![1, 3, 3, 1],
            "the first alone, then the queue in full batches"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_item_fails_alone() {
        let (runner, gate) = Recording::gated();
        let batcher = Batcher::new(runner, limits(8, 64, 1));
        let blocker = tokio::spawn({
            let batcher = batcher.clone();
            async move { batcher.submit(0).await }
        });
        settle().await;
        let tasks: Vec<_> = [2, 3, 4]
            .into_iter()
            .map(|item| {
                let batcher = batcher.clone();
                tokio::spawn(async move { batcher.submit(item).await })
            })
            .collect();
        settle().await;
        gate.add_permits(2);
        assert_eq!(blocker.await.unwrap(), Ok(Ok(0)));
        let outcomes: Vec<_> = futures_join(tasks).await;
        assert_eq!(
            outcomes,
            vec![Ok(Ok(4)), Ok(Err("item 3 is odd".to_owned())), Ok(Ok(8))]
        );
        assert_eq!(batches(&batcher)[1], vec![2, 3, 4], "they shared one batch");
    }

    async fn futures_join<T: Send + 'static>(tasks: Vec<tokio::task::JoinHandle<T>>) -> Vec<T> {
        let mut outcomes = Vec::new();
        for task in tasks {
            outcomes.push(task.await.expect("task"));
        }
        outcomes
    }

    #[tokio::test(start_paused = true)]
    async fn past_the_queue_bound_an_item_is_refused_and_never_run() {
        let (runner, gate) = Recording::gated();
        let batcher = Batcher::new(runner, limits(8, 2, 1));
        let in_flight = tokio::spawn({
            let batcher = batcher.clone();
            async move { batcher.submit(0).await }
        });
        settle().await;
        let queued: Vec<_> = [2, 4]
            .into_iter()
            .map(|item| {
                let batcher = batcher.clone();
                tokio::spawn(async move { batcher.submit(item).await })
            })
            .collect();
        settle().await;
        // Item 0 is in flight, 2 and 4 fill the queue.
        assert_eq!(
            batcher.submit(6).await,
            Err(BatchError::QueueFull { queued_items_max: 2 })
        );
        gate.add_permits(2);
        assert_eq!(in_flight.await.unwrap(), Ok(Ok(0)));
        assert_eq!(futures_join(queued).await, vec![Ok(Ok(4)), Ok(Ok(8))]);
        assert_eq!(batches(&batcher), vec![vec![0], vec![2, 4]], "6 was never run");
    }

    #[tokio::test(start_paused = true)]
    async fn dropping_a_waiting_caller_skips_its_item_and_answers_the_rest() {
        let (runner, gate) = Recording::gated();
        let batcher = Batcher::new(runner, limits(8, 64, 1));
        let in_flight = tokio::spawn({
            let batcher = batcher.clone();
            async move { batcher.submit(0).await }
        });
        settle().await;
        let kept = tokio::spawn({
            let batcher = batcher.clone();
            async move { batcher.submit(2).await }
        });
        let dropped = tokio::spawn({
            let batcher = batcher.clone();
            async move { batcher.submit(4).await }
        });
        settle().await;
        dropped.abort();
        assert!(dropped.await.unwrap_err().is_cancelled());
        gate.add_permits(2);
        assert_eq!(in_flight.await.unwrap(), Ok(Ok(0)));
        assert_eq!(kept.await.unwrap(), Ok(Ok(4)));
        assert_eq!(
            batches(&batcher),
            vec![vec![0], vec![2]],
            "the dropped item was never sent"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn dropping_a_caller_whose_item_is_in_flight_leaves_its_batch_whole() {
        let (runner, gate) = Recording::gated();
        let batcher = Batcher::new(runner, limits(8, 64, 1));
        let blocker = tokio::spawn({
            let batcher = batcher.clone();
            async move { batcher.submit(0).await }
        });
        settle().await;
        let tasks: Vec<_> = [2, 4, 6]
            .into_iter()
            .map(|item| {
                let batcher = batcher.clone();
                tokio::spawn(async move { batcher.submit(item).await })
            })
            .collect();
        settle().await;
        gate.add_permits(1);
        assert_eq!(blocker.await.unwrap(), Ok(Ok(0)));
        settle().await;
        assert_eq!(batches(&batcher)[1], vec![2, 4, 6], "the second batch is in flight");
        let mut tasks = tasks.into_iter();
        let first = tasks.next().unwrap();
        first.abort();
        assert!(first.await.unwrap_err().is_cancelled());
        gate.add_permits(1);
        assert_eq!(futures_join(tasks.collect()).await, vec![Ok(Ok(8)), Ok(Ok(12))]);
    }

    #[tokio::test(start_paused = true)]
    async fn no_more_batches_run_at_once_than_the_lanes() {
        let (runner, gate) = Recording::gated();
        let batcher = Batcher::new(runner, limits(2, 64, 2));
        let mut tasks = Vec::new();
        for item in 0..10u32 {
            let batcher_for_task = batcher.clone();
            tasks.push(tokio::spawn(async move { batcher_for_task.submit(item * 2).await }));
            if item < 2 {
                // Each of the first two finds a lane free.
                settle().await;
            }
        }
        settle().await;
        assert_eq!(
            batches(&batcher),
            vec![vec![0], vec![2]],
            "two lanes, one item each at first"
        );
        gate.add_permits(100);
        assert_eq!(futures_join(tasks).await.len(), 10);
        assert_eq!(batcher.shared.runner.running_max.load(Ordering::SeqCst), 2);
        assert_eq!(batcher.shared.lock().in_flight, 0, "every lane was given back");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lane_whose_runner_panics_answers_lost_and_is_given_back() {
        let (runner, gate) = Recording::gated();
        let batcher = Batcher::new(runner, limits(8, 64, 1));
        assert_eq!(batcher.submit(666).await, Err(BatchError::Lost));
        assert_eq!(batcher.shared.lock().in_flight, 0);
        gate.add_permits(1);
        assert_eq!(batcher.submit(2).await, Ok(Ok(4)), "a new lane starts");
    }

    #[test]
    fn only_the_first_item_of_each_key_goes_into_a_batch() {
        assert_eq!(first_item_of_each_key(["a", "b", "a", "c", "b", "a"]), vec![0, 1, 3]);
        assert_eq!(first_item_of_each_key(Vec::<u32>::new()), Vec::<usize>::new());
    }

    #[test]
    fn limits_outside_their_bounds_are_refused() {
        assert_eq!(BatchLimits::new(0, 1, 1), Err(InvalidBatchLimits::ItemsMax(0)));
        assert_eq!(
            BatchLimits::new(BATCH_ITEMS_MAX + 1, 1, 1),
            Err(InvalidBatchLimits::ItemsMax(BATCH_ITEMS_MAX + 1))
        );
        assert_eq!(BatchLimits::new(1, 0, 1), Err(InvalidBatchLimits::QueuedItemsMax(0)));
        assert_eq!(BatchLimits::new(1, 1, 0), Err(InvalidBatchLimits::InFlightMax(0)));
        assert_eq!(
            BatchLimits::new(1, 1, BATCHES_IN_FLIGHT_MAX + 1),
            Err(InvalidBatchLimits::InFlightMax(BATCHES_IN_FLIGHT_MAX + 1))
        );
        let limits = BatchLimits::new(BATCH_ITEMS_MAX, BATCH_QUEUED_ITEMS_MAX, BATCHES_IN_FLIGHT_MAX).unwrap();
        assert_eq!(limits.items_max(), BATCH_ITEMS_MAX);
    }
}
