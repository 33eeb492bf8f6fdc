//! Time as the client sees it: the monotonic clock that deadlines are
//! measured on, the wall clock an HTTP-date `Retry-After` is read against,
//! and the pause between attempts. Injected, so a test checks that
//! `Retry-After` and backoff were honoured by reading the pauses a
//! [`ManualClock`] was asked for, without sleeping.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

/// A pause between attempts.
pub type Pause = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// The client's clocks and its way of pausing.
pub trait Clock: Send + Sync + 'static {
    /// Now, on the monotonic clock deadlines are measured on.
    fn now(&self) -> Instant;
    /// Now, on the wall clock.
    fn wall_now(&self) -> SystemTime;
    /// A future that completes after `pause`.
    fn sleep(&self, pause: Duration) -> Pause;
}

/// Tokio's clock (so tokio's paused time applies) and the system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        tokio::time::Instant::now().into_std()
    }

    fn wall_now(&self) -> SystemTime {
        SystemTime::now()
    }

    fn sleep(&self, pause: Duration) -> Pause {
        Box::pin(tokio::time::sleep(pause))
    }
}

/// A clock that moves only when the client pauses: each pause returns at
/// once, moves both clocks on by its length and is recorded, so a test
/// reads what the client waited and the intent deadline still counts it.
#[derive(Debug)]
pub struct ManualClock {
    start: Instant,
    wall_start: SystemTime,
    state: Mutex<ManualState>,
}

#[derive(Debug, Default)]
struct ManualState {
    elapsed: Duration,
    pauses: Vec<Duration>,
}

/// Most pauses a [`ManualClock`] records; later ones still move it.
pub const MANUAL_PAUSES_RECORDED_MAX: usize = 10_000;

impl ManualClock {
    /// A clock whose wall time starts at `wall_start`.
    pub fn starting_at(wall_start: SystemTime) -> Self {
        Self {
            start: Instant::now(),
            wall_start,
            state: Mutex::new(ManualState::default()),
        }
    }

    /// Every pause asked for so far, in order.
    pub fn pauses(&self) -> Vec<Duration> {
        self.state().pauses.clone()
    }

    /// Moves the clock on by `by` without a pause.
    pub fn advance(&self, by: Duration) {
        self.state().elapsed += by;
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ManualState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::starting_at(SystemTime::now())
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.start + self.state().elapsed
    }

    fn wall_now(&self) -> SystemTime {
        self.wall_start + self.state().elapsed
    }

    fn sleep(&self, pause: Duration) -> Pause {
        let mut state = self.state();
        state.elapsed += pause;
        if state.pauses.len() < MANUAL_PAUSES_RECORDED_MAX {
            state.pauses.push(pause);
        }
        Box::pin(std::future::ready(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_manual_clock_moves_by_its_pauses_and_records_them() {
        let clock = ManualClock::default();
        let (before, wall_before) = (clock.now(), clock.wall_now());
        clock.sleep(Duration::from_secs(7)).await;
        clock.advance(Duration::from_secs(1));
        assert_eq!(clock.now() - before, Duration::from_secs(8));
        assert_eq!(
            clock.wall_now().duration_since(wall_before).unwrap(),
            Duration::from_secs(8)
        );
        assert_eq!(clock.pauses(), [Duration::from_secs(7)]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_system_clock_follows_tokios_paused_time() {
        let before = SystemClock.now();
        SystemClock.sleep(Duration::from_secs(30)).await;
        assert!(SystemClock.now() - before >= Duration::from_secs(30));
    }
}
