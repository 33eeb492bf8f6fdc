//! The clock a store reads, injected so that tests move time by hand.
//!
//! The state machine never reads a clock: every transition takes the time as
//! an argument (`now_ms`). A backend that decides lease expiry and retention
//! in its own process (the FDB-style store, on either engine: FoundationDB
//! has no server clock) reads it from a [`Clock`] it was given, so a test can
//! hand it a [`ManualClock`] and make a lease expire by moving the clock
//! instead of sleeping past it. Backends whose server decides expiry (Redis
//! scripts read `TIME`, PostgreSQL reads `now()`) take no clock: see
//! ARCHITECTURE.md, "Which clock decides lease expiry".
//!
//! A clock has two readings: wall time, which records are stamped with and
//! compared against (it must agree across the servers sharing a store, so it
//! is the system's real-time clock), and monotonic time, for the ages and
//! intervals a process measures on its own (a transaction's age, the wait
//! between two openings of a database), which a wall clock stepped back by
//! NTP must neither stretch nor shrink.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Where a store reads the time.
pub trait Clock: Send + Sync + fmt::Debug {
    /// Milliseconds since the Unix epoch: what `created_at_ms`,
    /// `locked_until_ms` and `expires_at_ms` are in.
    fn now_ms(&self) -> u64;

    /// Milliseconds since a fixed origin of this clock's choosing, never going
    /// back: for ages and intervals measured within one process.
    fn monotonic_ms(&self) -> u64;
}

/// A clock shared by a store, its engine and the test that moves it.
pub type SharedClock = Arc<dyn Clock>;

/// The system's clocks: real time for records, `Instant` for ages.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl SystemClock {
    pub fn shared() -> SharedClock {
        Arc::new(SystemClock)
    }
}

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        // A system clock set before 1970 reads as the epoch: every record
        // then looks fresh to this server, which tokens keep safe (a lease
        // is fenced by its token, not by the clock).
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|elapsed| elapsed.as_millis() as u64)
            .unwrap_or(0)
    }

    fn monotonic_ms(&self) -> u64 {
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        ORIGIN.get_or_init(Instant::now).elapsed().as_millis() as u64
    }
}

/// A clock that moves only when told to, for tests: both readings advance
/// together by [`ManualClock::advance`], so "the lease has expired" and "the
/// transaction is five seconds old" happen at once, without sleeping.
#[derive(Debug)]
pub struct ManualClock {
    wall_ms: AtomicU64,
    monotonic_ms: AtomicU64,
}

impl ManualClock {
    /// A clock reading `now_ms` (wall) and 0 (monotonic).
    pub fn starting_at(now_ms: u64) -> Arc<Self> {
        Arc::new(Self {
            wall_ms: AtomicU64::new(now_ms),
            monotonic_ms: AtomicU64::new(0),
        })
    }

    /// A clock starting at the system's current time, so records it stamps
    /// look like any others (a shared FoundationDB cluster, an operator
    /// reading a test's records).
    pub fn starting_now() -> Arc<Self> {
        Self::starting_at(SystemClock.now_ms())
    }

    /// Moves both readings forward by `by` (whole milliseconds).
    pub fn advance(&self, by: Duration) {
        self.advance_ms(by.as_millis() as u64);
    }

    /// Moves both readings forward by `ms`.
    pub fn advance_ms(&self, ms: u64) {
        self.wall_ms.fetch_add(ms, Ordering::SeqCst);
        self.monotonic_ms.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.wall_ms.load(Ordering::SeqCst)
    }

    fn monotonic_ms(&self) -> u64 {
        self.monotonic_ms.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_advanced_and_both_readings_together() {
        let clock = ManualClock::starting_at(1_000);
        assert_eq!((clock.now_ms(), clock.monotonic_ms()), (1_000, 0));
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(
            (clock.now_ms(), clock.monotonic_ms()),
            (1_000, 0),
            "time passed by itself"
        );
        clock.advance(Duration::from_millis(5_100));
        assert_eq!((clock.now_ms(), clock.monotonic_ms()), (6_100, 5_100));
        let shared: SharedClock = clock.clone();
        clock.advance_ms(1);
        assert_eq!(shared.now_ms(), 6_101, "every holder of the clock sees it move");
    }

    #[test]
    fn the_system_clock_reads_real_time_and_its_monotonic_reading_never_goes_back() {
        let before = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
        let clock = SystemClock;
        let read = clock.now_ms();
        assert!(read >= before && read - before < 60_000, "{read} vs {before}");
        let first = clock.monotonic_ms();
        std::thread::sleep(Duration::from_millis(20));
        let second = clock.monotonic_ms();
        assert!(second >= first + 20, "{first} then {second}");
    }
}
