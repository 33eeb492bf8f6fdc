//! The client's bound on requests on the wire, and the order in which
//! attempts waiting for a connection get one.
//!
//! First come, first served while the queue still empties; once it has not
//! been empty for a whole [`STANDING_INTERVAL`], the newest waiter first.
//! It is the rule the Label service applies to its own admission queue
//! (server/src/admission.rs, after "Fail at Scale", B. Maurer, ACM Queue
//! 13(8), 2015), applied where the queue of an overloaded run stands: in
//! the client. Under a standing queue the oldest waiters have spent most of
//! their deadline; a connection handed to one of them carries a request
//! whose client gives up before its answer comes, and the service's work
//! for it is wasted. The newest waiter still has its whole deadline, and
//! the oldest time out in the queue without costing the service anything.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// How long the queue must have stayed non-empty before the newest waiter
/// is served first: CoDel's interval, as the service's admission queue
/// (server/src/admission.rs, `ADMISSION_INTERVAL_MS_DEFAULT`).
pub const STANDING_INTERVAL: Duration = Duration::from_millis(100);

/// Who gets a connection that comes free while attempts wait for one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PoolOrder {
    /// The oldest waiter, always.
    Fifo,
    /// The oldest while the queue still empties, the newest once it stands.
    AdaptiveLifo,
}

impl std::fmt::Display for PoolOrder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PoolOrder::Fifo => "fifo",
            PoolOrder::AdaptiveLifo => "adaptive-lifo",
        })
    }
}

/// A bounded pool of permits, one per request on the wire.
#[derive(Debug)]
pub struct ConnectionPool {
    order: PoolOrder,
    state: Mutex<PoolState>,
}

#[derive(Debug)]
struct PoolState {
    free: usize,
    waiters: VecDeque<Waiter>,
    next_waiter_id: u64,
    /// The last moment nobody was waiting.
    last_empty: Instant,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    handover: oneshot::Sender<()>,
}

/// One request's place on the wire; given back when dropped.
#[derive(Debug)]
pub struct Connection {
    pool: Arc<ConnectionPool>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.pool.give_back();
    }
}

impl ConnectionPool {
    pub fn new(size: usize, order: PoolOrder) -> Arc<Self> {
        assert!(size > 0, "a pool of no connections serves nobody");
        Arc::new(Self {
            order,
            state: Mutex::new(PoolState {
                free: size,
                waiters: VecDeque::new(),
                next_waiter_id: 0,
                last_empty: Instant::now(),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        // Every update below leaves the state whole before it can panic.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A connection within `wait`, or `None` when none came free in time.
    pub async fn acquire(self: &Arc<Self>, wait: Duration) -> Option<Connection> {
        let mut place = {
            let mut state = self.lock();
            if state.free > 0 && state.waiters.is_empty() {
                state.free -= 1;
                state.last_empty = Instant::now();
                return Some(Connection { pool: self.clone() });
            }
            let (handover, handed) = oneshot::channel();
            let id = state.next_waiter_id;
            state.next_waiter_id += 1;
            state.waiters.push_back(Waiter { id, handover });
            WaitingPlace {
                pool: self.clone(),
                id,
                handed,
                served: false,
            }
        };
        let handed = tokio::time::timeout(wait, &mut place.handed).await;
        place.served = true;
        match handed {
            Ok(Ok(())) => Some(Connection { pool: self.clone() }),
            // The sender is dropped only after a send.
            Ok(Err(_)) => None,
            Err(_elapsed) => place.leave_or_take().then(|| Connection { pool: self.clone() }),
        }
    }

    /// A connection ends its request: to the next waiter, or back to the pool.
    fn give_back(&self) {
        let now = Instant::now();
        let mut state = self.lock();
        let newest_first =
            self.order == PoolOrder::AdaptiveLifo && now.duration_since(state.last_empty) >= STANDING_INTERVAL;
        loop {
            let next = if newest_first {
                state.waiters.pop_back()
            } else {
                state.waiters.pop_front()
            };
            if state.waiters.is_empty() {
                state.last_empty = now;
            }
            let Some(waiter) = next else {
                state.free += 1;
                return;
            };
            if waiter.handover.send(()).is_ok() {
                return;
            }
            // Not expected: a place leaves the queue (its drop, under this
            // lock) before its receiver is dropped. Should a receiver be gone
            // anyway, the connection goes to the next waiter, never lost.
        }
    }
}

/// An attempt in the queue. Dropped before it was served (its attempt was
/// cancelled), it leaves the queue, or gives back what it was handed.
struct WaitingPlace {
    pool: Arc<ConnectionPool>,
    id: u64,
    handed: oneshot::Receiver<()>,
    served: bool,
}

impl WaitingPlace {
    /// Leaves the queue at the end of the wait; true when a connection was
    /// handed over meanwhile (it is then this attempt's).
    fn leave_or_take(&mut self) -> bool {
        let mut state = self.pool.lock();
        if let Some(position) = state.waiters.iter().position(|waiter| waiter.id == self.id) {
            state.waiters.remove(position);
            if state.waiters.is_empty() {
                state.last_empty = Instant::now();
            }
            return false;
        }
        drop(state);
        self.handed.try_recv().is_ok()
    }
}

impl Drop for WaitingPlace {
    fn drop(&mut self) {
        if !self.served && self.leave_or_take() {
            self.pool.give_back();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Starts `count` waiters in order, each a task, and lets them queue.
    async fn queue_waiters(
        pool: &Arc<ConnectionPool>,
        count: usize,
    ) -> Vec<tokio::task::JoinHandle<Option<Connection>>> {
        let mut waiters = Vec::new();
        for _ in 0..count {
            let pool = pool.clone();
            waiters.push(tokio::spawn(async move { pool.acquire(Duration::from_secs(1)).await }));
            tokio::task::yield_now().await;
        }
        waiters
    }

    fn served(waiters: &[tokio::task::JoinHandle<Option<Connection>>]) -> Vec<usize> {
        waiters
            .iter()
            .enumerate()
            .filter(|(_, waiter)| waiter.is_finished())
            .map(|(index, _)| index)
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn the_bound_holds_and_a_waiter_times_out_without_a_connection() {
        let pool = ConnectionPool::new(1, PoolOrder::AdaptiveLifo);
        let taken = pool.acquire(Duration::ZERO).await.expect("a free connection");
        assert!(
            pool.acquire(Duration::from_millis(50)).await.is_none(),
            "the only one is taken"
        );
        drop(taken);
        assert!(pool.acquire(Duration::ZERO).await.is_some(), "given back");
        assert!(pool.lock().waiters.is_empty(), "the timed-out waiter left the queue");
    }

    #[tokio::test(start_paused = true)]
    async fn a_queue_that_empties_serves_the_oldest_first() {
        let pool = ConnectionPool::new(1, PoolOrder::AdaptiveLifo);
        let taken = pool.acquire(Duration::ZERO).await.unwrap();
        let waiters = queue_waiters(&pool, 3).await;
        tokio::time::advance(STANDING_INTERVAL / 2).await;
        drop(taken);
        tokio::task::yield_now().await;
        assert_eq!(served(&waiters), vec![0], "not standing yet: first come, first served");
    }

    #[tokio::test(start_paused = true)]
    async fn a_standing_queue_serves_the_newest_first_unless_the_order_is_fifo() {
        for (order, expected) in [(PoolOrder::AdaptiveLifo, 2), (PoolOrder::Fifo, 0)] {
            let pool = ConnectionPool::new(1, order);
            let taken = pool.acquire(Duration::ZERO).await.unwrap();
            let waiters = queue_waiters(&pool, 3).await;
            tokio::time::advance(STANDING_INTERVAL).await;
            drop(taken);
            tokio::task::yield_now().await;
            assert_eq!(served(&waiters), vec![expected], "{order:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_waiter_leaks_no_connection_and_leaves_the_queue() {
        let pool = ConnectionPool::new(1, PoolOrder::AdaptiveLifo);
        let taken = pool.acquire(Duration::ZERO).await.unwrap();
        let cancelled = queue_waiters(&pool, 1).await;
        drop(taken);
        // Handed over, then dropped before it ran: the connection comes back.
        cancelled[0].abort();
        tokio::task::yield_now().await;
        assert_eq!(pool.lock().free, 1, "the handed connection came back");
        let held = pool.acquire(Duration::ZERO).await.expect("the free connection");
        let waiting = queue_waiters(&pool, 1).await;
        assert_eq!(pool.lock().waiters.len(), 1);
        waiting[0].abort();
        tokio::task::yield_now().await;
        assert!(pool.lock().waiters.is_empty(), "an aborted waiter leaves the queue");
        drop(held);
        assert_eq!(pool.lock().free, 1, "one connection, free again");
    }
}
