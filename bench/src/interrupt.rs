//! Ctrl-C (SIGINT) and SIGTERM. The first stops the load: no new operation
//! starts, those in flight get at most [`INTERRUPT_DRAIN_MS_MAX`] to end,
//! every process the bench spawned is stopped as on a normal exit, and the
//! partial report is printed and written, marked as interrupted. A second
//! signal ends the bench at once; its children still go, killed by the
//! kernel (test-support's `child` module ties each one to the bench).
//!
//! The request is process-wide, as the signals are: the engine, the ramp,
//! the overload profile and the commands' loops each look at [`global`].
//! The engine's own functions also take an [`Interrupt`] of their own, so
//! its tests can interrupt one run without touching the others.

use serde::{Deserialize, Serialize};
use std::future::Future;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Longest wait, from the first signal, for the operations and the copies
/// of intents still in flight and for the server to go idle, before the
/// bench stops its children and reports.
pub const INTERRUPT_DRAIN_MS_MAX: u64 = 5_000;
/// Longest the dispatcher sleeps before it looks at the request again, so
/// that a low rate (seconds between arrivals) still stops at once.
pub const INTERRUPT_POLL_MS: u64 = 20;

/// The signal that interrupted the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum InterruptSignal {
    #[serde(rename = "SIGINT")]
    Interrupt,
    #[serde(rename = "SIGTERM")]
    Terminate,
}

impl InterruptSignal {
    pub fn name(self) -> &'static str {
        match self {
            Self::Interrupt => "SIGINT",
            Self::Terminate => "SIGTERM",
        }
    }

    /// The shell's convention: 128 plus the signal's number.
    pub fn exit_code(self) -> u8 {
        match self {
            Self::Interrupt => 128 + 2,
            Self::Terminate => 128 + 15,
        }
    }
}

/// What the report says about an interrupted run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Interruption {
    pub signal: InterruptSignal,
    /// Seconds from the command's start to the signal.
    pub after_s: f64,
    /// The longest wait for the requests in flight, in milliseconds.
    pub drain_ms_max: u64,
}

/// A request to stop, and who is waiting for it.
pub struct Interrupt {
    created: Instant,
    /// The longest wait for what is in flight ([`INTERRUPT_DRAIN_MS_MAX`]).
    drain: Duration,
    /// The first signal and when it came.
    requested: OnceLock<(InterruptSignal, Instant)>,
    /// Signals received, the first included.
    received: AtomicU32,
    notify: Notify,
}

impl Default for Interrupt {
    fn default() -> Self {
        Self::new()
    }
}

impl Interrupt {
    pub fn new() -> Self {
        Self::with_drain(Duration::from_millis(INTERRUPT_DRAIN_MS_MAX))
    }

    /// With another longest wait for what is in flight (tests).
    pub fn with_drain(drain: Duration) -> Self {
        Self {
            created: Instant::now(),
            drain,
            requested: OnceLock::new(),
            received: AtomicU32::new(0),
            notify: Notify::new(),
        }
    }

    /// Records a signal; returns how many have been received, this one
    /// included. Only the first one's kind and time are kept.
    pub fn request(&self, signal: InterruptSignal) -> u32 {
        let _ = self.requested.set((signal, Instant::now()));
        self.notify.notify_waiters();
        self.received.fetch_add(1, Ordering::SeqCst) + 1
    }

    pub fn is_requested(&self) -> bool {
        self.requested.get().is_some()
    }

    pub fn interruption(&self) -> Option<Interruption> {
        let (signal, at) = *self.requested.get()?;
        Some(Interruption {
            signal,
            after_s: at.duration_since(self.created).as_secs_f64(),
            drain_ms_max: u64::try_from(self.drain.as_millis()).unwrap_or(u64::MAX),
        })
    }

    /// When the wait for what is in flight ends, once interrupted.
    pub fn drain_deadline(&self) -> Option<Instant> {
        let (_, at) = self.requested.get()?;
        Some(*at + self.drain)
    }

    /// Resolves once a stop is requested.
    pub async fn requested(&self) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            // Registered before the check, so a request between the check
            // and the await still wakes this waiter.
            notified.as_mut().enable();
            if self.is_requested() {
                return;
            }
            notified.await;
        }
    }

    /// Resolves at the drain deadline of a requested stop.
    pub async fn drained(&self) {
        self.requested().await;
        let deadline = self.drain_deadline().expect("a requested stop has a drain deadline");
        tokio::time::sleep_until(deadline.into()).await;
    }

    /// `work`'s output, or `None` when a stop was requested and `work` had
    /// not ended by the drain deadline.
    pub async fn until_drained<F: Future>(&self, work: F) -> Option<F::Output> {
        tokio::select! {
            output = work => Some(output),
            () = self.drained() => None,
        }
    }
}

/// The process-wide request, set by the signal listener.
pub fn global() -> &'static Interrupt {
    static GLOBAL: OnceLock<Interrupt> = OnceLock::new();
    GLOBAL.get_or_init(Interrupt::new)
}

/// True once the process was asked to stop.
pub fn requested() -> bool {
    global().is_requested()
}

/// Listens for SIGINT and SIGTERM on the current runtime for the rest of
/// the process. Fails when the handlers cannot be installed.
pub fn listen() -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let interrupt = global();
    let mut interrupts = signal(SignalKind::interrupt())?;
    let mut terminates = signal(SignalKind::terminate())?;
    tokio::spawn(async move {
        loop {
            let signal = tokio::select! {
                _ = interrupts.recv() => InterruptSignal::Interrupt,
                _ = terminates.recv() => InterruptSignal::Terminate,
            };
            on_signal(interrupt, signal);
        }
    });
    Ok(())
}

fn on_signal(interrupt: &Interrupt, signal: InterruptSignal) {
    let received = interrupt.request(signal);
    let name = signal.name();
    if received == 1 {
        eprintln!(
            "\nidem-bench: {name}: stopping the load; waiting at most {} s for the requests in flight, then stopping every process this run started and writing the partial report (a second Ctrl-C stops at once)",
            INTERRUPT_DRAIN_MS_MAX / 1_000
        );
        return;
    }
    eprintln!(
        "\nidem-bench: {name} again: stopping at once, without a report; the kernel ends every process this run started"
    );
    // No destructor runs past this point; the children's death signal
    // (SIGKILL, set when each was spawned) fires as the process ends.
    std::process::exit(i32::from(signal.exit_code()));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A short drain, so the test does not wait the real one out.
    const TEST_DRAIN_MS: u64 = 50;

    #[tokio::test]
    async fn a_request_wakes_the_waiters_and_bounds_the_drain() {
        let interrupt = std::sync::Arc::new(Interrupt::with_drain(Duration::from_millis(TEST_DRAIN_MS)));
        assert!(interrupt.interruption().is_none());
        let waiter = {
            let interrupt = interrupt.clone();
            tokio::spawn(async move { interrupt.until_drained(std::future::pending::<()>()).await })
        };
        tokio::task::yield_now().await;
        assert_eq!(interrupt.request(InterruptSignal::Terminate), 1);
        assert_eq!(interrupt.request(InterruptSignal::Interrupt), 2);
        // The never-ending work is given up on at the drain deadline.
        assert_eq!(waiter.await.unwrap(), None);
        let interruption = interrupt.interruption().unwrap();
        assert_eq!(
            interruption.signal,
            InterruptSignal::Terminate,
            "the first signal is kept"
        );
        assert_eq!(interruption.drain_ms_max, TEST_DRAIN_MS);
    }

    #[tokio::test]
    async fn work_that_ends_in_time_keeps_its_output() {
        let interrupt = Interrupt::with_drain(Duration::from_millis(TEST_DRAIN_MS));
        assert_eq!(interrupt.until_drained(async { 7 }).await, Some(7));
        interrupt.request(InterruptSignal::Interrupt);
        assert_eq!(interrupt.until_drained(async { 8 }).await, Some(8));
    }
}
