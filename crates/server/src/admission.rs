//! How much work the server takes on at once.
//!
//! Every API request needs a slot; without one it is refused at once with
//! 503 `overloaded` (cheap, and the client's backoff spreads its retry). A
//! slot is held until the request's work is done, including work that
//! outlives the request: the idempotency layer keeps its slot in the task
//! that finishes a claim and a route after the client hung up, so requests
//! whose clients gave up cannot pile up behind the limit.
//!
//! The limit adapts (additive increase, multiplicative decrease) to the
//! latency of claims, the first store call of every idempotent request.
//! Claims get slow when the store or the CPU is saturated; then every
//! request waits longer than its client will, clients time out and retry,
//! and the retries add load: congestion collapse. A claim slower than the
//! target shrinks the limit (at most once per [`DECREASE_INTERVAL_MS`]);
//! every claim within it grows the limit by one while at least half the
//! slots are taken. The limit stays between [`IN_FLIGHT_MIN`] and the
//! configured `server.in_flight_max`. The carrier call is not part of the
//! signal: a slow carrier needs more requests in flight, not fewer.

use crate::error::ApiError;
use crate::metrics::ADMISSION_LIMIT;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The limit never drops below this many requests in flight (nor below a
/// smaller configured most).
pub const IN_FLIGHT_MIN: usize = 16;
/// Shortest time between two decreases: one slow burst of claims is one
/// congestion signal, not one per claim.
pub const DECREASE_INTERVAL_MS: u64 = 100;
/// What a decrease multiplies the limit by.
pub const DECREASE_FACTOR: f64 = 0.75;

/// The adaptive limit, shared by every request. Cheap to clone.
#[derive(Clone)]
pub struct Admission {
    shared: Arc<Shared>,
}

struct Shared {
    in_flight: AtomicUsize,
    limit: Mutex<AimdLimit>,
    /// The limit as last computed, read without the lock on every admission.
    current_limit: AtomicUsize,
    retry_after_s: u64,
}

impl Admission {
    pub fn new(in_flight_max: usize, claim_latency_target: Duration, retry_after_s: u64) -> Self {
        let limit = AimdLimit::new(in_flight_max, claim_latency_target);
        metrics::gauge!(ADMISSION_LIMIT).set(limit.current() as f64);
        Self {
            shared: Arc::new(Shared {
                in_flight: AtomicUsize::new(0),
                current_limit: AtomicUsize::new(limit.current()),
                limit: Mutex::new(limit),
                retry_after_s,
            }),
        }
    }

    /// A slot, if one is free under the current limit.
    pub fn try_admit(&self) -> Option<Slot> {
        let limit = self.shared.current_limit.load(Ordering::Relaxed);
        self.shared
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |taken| {
                (taken < limit).then_some(taken + 1)
            })
            .ok()?;
        Some(Slot(Arc::new(SlotGuard {
            shared: self.shared.clone(),
        })))
    }

    pub fn limit(&self) -> usize {
        self.shared.current_limit.load(Ordering::Relaxed)
    }

    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::Relaxed)
    }
}

/// One admitted request's share of the limit, freed when the last clone is
/// dropped. The middleware puts one in the request's extensions; work that
/// outlives the request keeps a clone.
#[derive(Clone)]
pub struct Slot(Arc<SlotGuard>);

struct SlotGuard {
    shared: Arc<Shared>,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Slot {
    /// Feeds one claim's latency to the limit.
    pub fn claimed_in(&self, latency: Duration) {
        let shared = &self.0.shared;
        let in_flight = shared.in_flight.load(Ordering::Relaxed);
        let mut limit = shared.limit.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let before = limit.current();
        limit.on_claim(latency, in_flight, Instant::now());
        let after = limit.current();
        drop(limit);
        if after != before {
            shared.current_limit.store(after, Ordering::Relaxed);
            metrics::gauge!(ADMISSION_LIMIT).set(after as f64);
        }
    }
}

/// Middleware: a slot per request, or 503 `overloaded` at once.
pub async fn admit(State(admission): State<Admission>, mut request: Request, next: Next) -> Response {
    let Some(slot) = admission.try_admit() else {
        return ApiError::Overloaded {
            retry_after_s: admission.shared.retry_after_s,
        }
        .into_response();
    };
    request.extensions_mut().insert(slot);
    next.run(request).await
}

/// Additive increase, multiplicative decrease, driven by claim latencies.
/// Pure: the caller passes the time.
#[derive(Debug, Clone)]
pub struct AimdLimit {
    limit: f64,
    limit_min: usize,
    limit_max: usize,
    target: Duration,
    last_decrease: Option<Instant>,
}

impl AimdLimit {
    /// Starts at the most: an idle server takes whatever comes until the
    /// claims say otherwise.
    pub fn new(limit_max: usize, target: Duration) -> Self {
        let limit_max = limit_max.max(1);
        Self {
            limit: limit_max as f64,
            limit_min: IN_FLIGHT_MIN.min(limit_max),
            limit_max,
            target,
            last_decrease: None,
        }
    }

    pub fn current(&self) -> usize {
        self.limit as usize
    }

    pub fn on_claim(&mut self, latency: Duration, in_flight: usize, now: Instant) {
        if latency > self.target {
            let decreased_lately = self
                .last_decrease
                .is_some_and(|at| now.duration_since(at) < Duration::from_millis(DECREASE_INTERVAL_MS));
            if !decreased_lately {
                self.limit = (self.limit * DECREASE_FACTOR).max(self.limit_min as f64);
                self.last_decrease = Some(now);
            }
        } else if in_flight * 2 >= self.current() {
            // Grow only while the limit is being used, so an idle spell
            // does not leave it far above what was ever tested.
            self.limit = (self.limit + 1.0).min(self.limit_max as f64);
        }
        debug_assert!((self.limit_min as f64..=self.limit_max as f64).contains(&self.limit));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TARGET: Duration = Duration::from_millis(50);
    const FAST: Duration = Duration::from_millis(5);
    const SLOW: Duration = Duration::from_millis(400);

    #[test]
    fn slow_claims_shrink_the_limit_once_per_interval_down_to_the_floor() {
        let mut limit = AimdLimit::new(1_000, TARGET);
        let start = Instant::now();
        for _ in 0..50 {
            limit.on_claim(SLOW, 1_000, start);
        }
        assert_eq!(limit.current(), 750, "a burst of slow claims is one signal");
        let mut now = start;
        for _ in 0..100 {
            now += Duration::from_millis(DECREASE_INTERVAL_MS);
            limit.on_claim(SLOW, 1_000, now);
        }
        assert_eq!(limit.current(), IN_FLIGHT_MIN);
    }

    #[test]
    fn fast_claims_grow_the_limit_back_while_it_is_used_and_never_past_the_most() {
        let mut limit = AimdLimit::new(200, TARGET);
        limit.on_claim(SLOW, 200, Instant::now());
        assert_eq!(limit.current(), 150);
        for _ in 0..10 {
            limit.on_claim(FAST, 10, Instant::now());
        }
        assert_eq!(limit.current(), 150, "a mostly idle limit does not grow");
        for _ in 0..1_000 {
            limit.on_claim(FAST, 150, Instant::now());
        }
        assert_eq!(limit.current(), 200);
    }

    #[test]
    fn a_most_below_the_floor_is_kept_as_configured() {
        let mut limit = AimdLimit::new(1, TARGET);
        limit.on_claim(SLOW, 1, Instant::now());
        assert_eq!(limit.current(), 1);
    }

    #[test]
    fn slots_are_refused_past_the_limit_and_freed_by_their_last_clone() {
        let admission = Admission::new(IN_FLIGHT_MIN, TARGET, 1);
        let slots: Vec<Slot> = (0..IN_FLIGHT_MIN).map(|_| admission.try_admit().unwrap()).collect();
        assert!(admission.try_admit().is_none());
        let kept_by_a_task = slots[0].clone();
        drop(slots);
        assert_eq!(admission.in_flight(), 1, "the clone still holds its slot");
        drop(kept_by_a_task);
        assert_eq!(admission.in_flight(), 0);
        assert!(admission.try_admit().is_some());
    }

    #[test]
    fn a_slow_claim_lowers_the_limit_that_admission_applies() {
        let admission = Admission::new(100, TARGET, 1);
        let slot = admission.try_admit().unwrap();
        slot.claimed_in(SLOW);
        assert_eq!(admission.limit(), 75);
    }
}
