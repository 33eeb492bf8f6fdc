//! Failpoints in the label create path, for the reliability tests (RELIABILITY.md).
//!
//! Compiled in only with the `failpoints` feature; without it [`reached`]
//! does nothing and the `fail` crate is not linked. The points, in the order
//! a create passes them:
//!
//! | name | where |
//! |---|---|
//! | [`AFTER_CLAIM`] | the claim (transaction 1) has committed; the handler starts |
//! | [`AFTER_CARRIER`] | the carrier has sold the label; nothing is recorded yet |
//! | [`BEFORE_COMMIT`] | inside the completing transaction, the label written, before the commit (Redis: the label committed, the record not yet completed; PostgreSQL: before the one statement that writes both, or inside the transaction when it takes one) |
//! | [`AFTER_COMMIT`] | the label and the record have committed; the reply is not sent yet |
//!
//! They are configured like the `fail` crate's own, from the `FAILPOINTS`
//! environment variable (`name=actions;name=actions`), read on first use.
//! Every `fail` action works (`sleep(ms)`, `panic`, `pause`, `N*`, `P%`), and
//! `return` has a meaning of its own here:
//! - `return`: crash here. The process prints [`REACHED_MARKER`] and the
//!   point's name on stderr and parks this request forever, so that a harness
//!   reading stderr can SIGKILL it while it stands exactly at this step.
//! - `return(MS)`: stall this request for MS milliseconds without blocking
//!   the runtime (the `fail` crate's `sleep` blocks a worker thread), then go on.

/// The claim committed; the label handler starts.
pub const AFTER_CLAIM: &str = "label.after_claim";
/// The carrier answered with a label; nothing is recorded yet.
pub const AFTER_CARRIER: &str = "label.after_carrier";
/// Inside the completing transaction, before its commit.
pub const BEFORE_COMMIT: &str = "label.before_commit";
/// After the commit, before the reply.
pub const AFTER_COMMIT: &str = "label.after_commit";
/// Every failpoint, in the order a create reaches them.
pub const ALL: [&str; 4] = [AFTER_CLAIM, AFTER_CARRIER, BEFORE_COMMIT, AFTER_COMMIT];

/// Moves the clock the stores and the idempotency layer read by this many
/// milliseconds (signed), in builds with the `failpoints` feature only: the
/// fault campaign runs one instance of a fleet with its clock ahead or
/// behind the others. A build without the feature ignores it.
pub const CLOCK_OFFSET_VARIABLE: &str = "IDEM_TEST_CLOCK_OFFSET_MS";

/// The clock the server runs on: the system's, moved by
/// [`CLOCK_OFFSET_VARIABLE`] in a test build that sets it.
pub fn clock() -> store_core::SharedClock {
    #[cfg(feature = "failpoints")]
    if let Some(clock) = enabled::offset_clock() {
        return clock;
    }
    store_core::SystemClock::shared()
}

/// The environment variable that configures failpoints (the `fail` crate's name).
pub const FAILPOINTS_VARIABLE: &str = "FAILPOINTS";
/// Printed on stderr, followed by a space and the point's name, when a
/// `return` failpoint parks a request for the harness to kill the process.
pub const REACHED_MARKER: &str = "idem-failpoint-reached";

/// Evaluates the failpoint `name` (one of the constants above).
pub async fn reached(name: &'static str) {
    #[cfg(feature = "failpoints")]
    enabled::reached(name).await;
    #[cfg(not(feature = "failpoints"))]
    let _ = name;
}

#[cfg(feature = "failpoints")]
mod enabled {
    use super::{CLOCK_OFFSET_VARIABLE, FAILPOINTS_VARIABLE, REACHED_MARKER};
    use std::io::Write;
    use std::sync::{Arc, Once};
    use std::time::Duration;
    use store_core::{Clock, SharedClock, SystemClock};

    /// The system's clock, `offset_ms` away in real time; intervals unchanged.
    #[derive(Debug)]
    struct OffsetClock {
        offset_ms: i64,
    }

    impl Clock for OffsetClock {
        fn now_ms(&self) -> u64 {
            SystemClock.now_ms().saturating_add_signed(self.offset_ms)
        }

        fn monotonic_ms(&self) -> u64 {
            SystemClock.monotonic_ms()
        }
    }

    /// A clock moved by [`CLOCK_OFFSET_VARIABLE`], when it is set.
    pub(super) fn offset_clock() -> Option<SharedClock> {
        let setting = std::env::var(CLOCK_OFFSET_VARIABLE).ok()?;
        match setting.trim().parse::<i64>() {
            Ok(offset_ms) => {
                tracing::warn!(
                    offset_ms,
                    "{CLOCK_OFFSET_VARIABLE}: this process's clock is moved (a test build)"
                );
                Some(Arc::new(OffsetClock { offset_ms }))
            }
            Err(error) => {
                tracing::error!(%error, "{CLOCK_OFFSET_VARIABLE}: ignored, not a number of milliseconds");
                None
            }
        }
    }

    static CONFIGURED: Once = Once::new();

    pub(super) async fn reached(name: &'static str) {
        CONFIGURED.call_once(configure_from_environment);
        let Some(argument) = fail::eval(name, |argument| argument) else {
            return;
        };
        match argument.as_deref().map(str::parse::<u64>) {
            Some(Ok(stall_ms)) => tokio::time::sleep(Duration::from_millis(stall_ms)).await,
            _ => park_for_the_harness(name).await,
        }
    }

    /// Announces the point and never returns: the harness kills the process.
    async fn park_for_the_harness(name: &'static str) {
        announce(name);
        std::future::pending::<()>().await;
    }

    fn announce(name: &'static str) {
        let mut stderr = std::io::stderr().lock();
        let _ = writeln!(stderr, "{REACHED_MARKER} {name}");
        let _ = stderr.flush();
    }

    /// `FAILPOINTS=name=actions;name=actions`, as the `fail` crate reads it.
    fn configure_from_environment() {
        let Ok(settings) = std::env::var(FAILPOINTS_VARIABLE) else {
            return;
        };
        for setting in settings.split(';').filter(|setting| !setting.trim().is_empty()) {
            let configured = match setting.split_once('=') {
                Some((name, actions)) => fail::cfg(name.trim(), actions.trim()),
                None => Err(format!("{setting:?} is not name=actions")),
            };
            if let Err(error) = configured {
                tracing::error!(%error, "{FAILPOINTS_VARIABLE}: ignored a failpoint setting");
            }
        }
    }
}
