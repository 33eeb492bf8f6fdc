//! Waiting for a started record to change (docs/design.md#waiting).
//!
//! A request that asks to wait (`Prefer: wait=N`) and finds the key started
//! by another attempt does not sleep in a loop: it registers with the store's
//! [`ChangeHub`] and is woken when the record may have changed. This module
//! is the part every backend shares:
//!
//! - the registry of waiters, with a cap per record, per caller and per
//!   store instance ([`WaitLimits`]); past a cap a waiter is refused at once
//!   ([`WaitRefused`]), never queued;
//! - the fan-out of one notification to every local waiter on that record
//!   (one `tokio::sync::watch` channel per waited record);
//! - the bounded fallback poll: a waiter also wakes every
//!   [`WaitLimits::poll_interval_ms`] and reads the record again, so a lost
//!   notification costs at most one interval, never the whole wait;
//! - [`claim_waiting`], the loop the HTTP layer runs.
//!
//! A backend brings only a notification source: it calls
//! [`ChangeHub::notify`] after its own writes that end a started state
//! (complete, release, abandon), and, where other processes write too, a
//! [`ChangeSource`] that turns their writes into [`ChangeNotifier::notify`]
//! calls (PostgreSQL `LISTEN`, Redis sharded pub/sub, FoundationDB watches).
//!
//! **No lost wake-up.** A waiter subscribes first and reads the record
//! after: a change committed before the read is seen by the read, and a
//! change after it bumps the record's channel, which the waiter's receiver
//! (made at subscription) reports even if nobody was awaiting it yet. A
//! source that needs time to arm (a FoundationDB watch, a Redis `SSUBSCRIBE`)
//! wakes its waiters once more when armed, so a change between the
//! subscription and the arming is read then.

use crate::outcome::{ClaimOutcome, ClaimRequest};
use crate::store::{IdempotencyStore, StoreError};
use crate::types::{CallerId, IdempotencyKey, KeyDigest};
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Waiters on one record in one store instance, by default. The
/// specification's test waits 50 at once; past the cap a waiter gets 409 at
/// once, as without waiting (docs/design.md#wait-limits).
pub const WAITERS_PER_KEY_MAX_DEFAULT: usize = 128;
/// Waiters in one store instance (one process's store), by default. Each is
/// a parked future and a watch receiver, no thread and no connection; the cap
/// bounds memory and the re-reads a burst of wake-ups causes, and stays under
/// FoundationDB's default of 10,000 watches per client (one per waited key).
pub const WAITERS_PER_INSTANCE_MAX_DEFAULT: usize = 4_096;
/// How often a waiter reads the record again when no notification came, by
/// default: the most a lost notification (a listener connection that
/// dropped, a failover) delays a waiter.
pub const WAIT_POLL_INTERVAL_MS_DEFAULT: u64 = 1_000;
/// Shortest poll interval accepted: below it the fallback becomes the sleep
/// loop that notifications exist to avoid.
pub const WAIT_POLL_INTERVAL_MS_MIN: u64 = 10;
/// Longest poll interval accepted: a lost notification must not stall a
/// waiter for longer than this.
pub const WAIT_POLL_INTERVAL_MS_MAX: u64 = 60_000;

/// The caps and the poll interval of one [`ChangeHub`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitLimits {
    waiters_per_key_max: usize,
    waiters_per_instance_max: usize,
    /// One caller's waiters, all its keys together: without it one caller
    /// could hold every place of the instance's cap (and whatever each
    /// waiter holds in the application, such as an in-flight slot).
    waiters_per_caller_max: usize,
    poll_interval_ms: u64,
}

/// A [`WaitLimits`] that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidWaitLimits {
    #[error("a waiter cap of 0 refuses every waiter; turn waiting off instead")]
    ZeroCap,
    #[error("the per-key cap {per_key} is above the per-instance cap {per_instance}")]
    KeyCapAboveInstanceCap { per_key: usize, per_instance: usize },
    #[error("the per-caller cap {per_caller} is above the per-instance cap {per_instance}")]
    CallerCapAboveInstanceCap { per_caller: usize, per_instance: usize },
    #[error("the poll interval {0} ms is outside {WAIT_POLL_INTERVAL_MS_MIN}..={WAIT_POLL_INTERVAL_MS_MAX} ms")]
    PollInterval(u64),
}

impl WaitLimits {
    pub fn new(
        waiters_per_key_max: usize,
        waiters_per_instance_max: usize,
        poll_interval_ms: u64,
    ) -> Result<Self, InvalidWaitLimits> {
        if waiters_per_key_max == 0 || waiters_per_instance_max == 0 {
            return Err(InvalidWaitLimits::ZeroCap);
        }
        if waiters_per_key_max > waiters_per_instance_max {
            return Err(InvalidWaitLimits::KeyCapAboveInstanceCap {
                per_key: waiters_per_key_max,
                per_instance: waiters_per_instance_max,
            });
        }
        if !(WAIT_POLL_INTERVAL_MS_MIN..=WAIT_POLL_INTERVAL_MS_MAX).contains(&poll_interval_ms) {
            return Err(InvalidWaitLimits::PollInterval(poll_interval_ms));
        }
        Ok(Self {
            waiters_per_key_max,
            waiters_per_instance_max,
            waiters_per_caller_max: waiters_per_instance_max,
            poll_interval_ms,
        })
    }

    /// These limits with one caller's waiters capped at `max` (by default
    /// the per-instance cap: no cap of its own).
    pub fn with_waiters_per_caller_max(self, max: usize) -> Result<Self, InvalidWaitLimits> {
        if max == 0 {
            return Err(InvalidWaitLimits::ZeroCap);
        }
        if max > self.waiters_per_instance_max {
            return Err(InvalidWaitLimits::CallerCapAboveInstanceCap {
                per_caller: max,
                per_instance: self.waiters_per_instance_max,
            });
        }
        Ok(Self {
            waiters_per_caller_max: max,
            ..self
        })
    }

    pub fn waiters_per_caller_max(&self) -> usize {
        self.waiters_per_caller_max
    }

    pub fn waiters_per_key_max(&self) -> usize {
        self.waiters_per_key_max
    }

    pub fn waiters_per_instance_max(&self) -> usize {
        self.waiters_per_instance_max
    }

    pub fn poll_interval_ms(&self) -> u64 {
        self.poll_interval_ms
    }
}

impl Default for WaitLimits {
    fn default() -> Self {
        Self {
            waiters_per_key_max: WAITERS_PER_KEY_MAX_DEFAULT,
            waiters_per_instance_max: WAITERS_PER_INSTANCE_MAX_DEFAULT,
            waiters_per_caller_max: WAITERS_PER_INSTANCE_MAX_DEFAULT,
            poll_interval_ms: WAIT_POLL_INTERVAL_MS_DEFAULT,
        }
    }
}

/// One record, as waiting names it: the caller and the key's digest (never
/// the key itself, which may carry personal data).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RecordId {
    pub caller: CallerId,
    pub digest: KeyDigest,
}

impl RecordId {
    pub fn new(caller: &CallerId, key: &IdempotencyKey) -> Self {
        Self {
            caller: caller.clone(),
            digest: key.digest(),
        }
    }

    /// `caller:hex digest`, at most 64 + 1 + 64 bytes: the payload of a
    /// PostgreSQL notification (far below its 8,000-byte limit) and the
    /// inside of a Redis hash tag. Caller ids never contain `:`.
    pub fn tag(&self) -> String {
        format!("{}:{}", self.caller, self.digest)
    }

    /// Reads a [`RecordId::tag`] back; `None` for anything else.
    pub fn from_tag(tag: &str) -> Option<Self> {
        let (caller, digest_hex) = tag.split_once(':')?;
        let mut digest = [0u8; 32];
        hex::decode_to_slice(digest_hex, &mut digest).ok()?;
        Some(Self {
            caller: CallerId::new(caller).ok()?,
            digest: KeyDigest(digest),
        })
    }
}

impl fmt::Display for RecordId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.tag())
    }
}

/// Why a waiter was refused at once (the HTTP layer answers 409 with
/// `Retry-After`, as it would without waiting).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WaitRefused {
    #[error("too many waiters on this key ({0} at most)")]
    TooManyWaitersOnKey(usize),
    #[error("too many waiters in this instance ({0} at most)")]
    TooManyWaitersOnInstance(usize),
    #[error("too many waiters of this caller in this instance ({0} at most)")]
    TooManyWaitersOfCaller(usize),
    #[error("this store cannot wake waiters")]
    NotSupported,
}

/// Why [`RecordWatch::changed`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woken {
    /// The record may have changed: a notification came (possibly before
    /// this call, since the subscription).
    Notified,
    /// No notification within the poll interval: read the record anyway.
    PollDue,
    /// The deadline passed with no notification.
    DeadlinePassed,
}

/// Where a backend whose records other processes write turns their writes
/// into notifications (docs/design.md#waiting). The hub calls
/// [`ChangeSource::watch_record`], under its lock, when the first local
/// waiter on a record arrives; the guard it returns is dropped when the last
/// one leaves. It must not block: spawn, or send to a task of its own.
#[async_trait::async_trait]
pub trait ChangeSource: Send + Sync + 'static {
    fn watch_record(&self, record: &RecordId, notifier: ChangeNotifier) -> WatchGuard;

    /// Makes sure that the end of `record`'s started state, if it is still
    /// started, will be announced. [`claim_waiting`] calls it before every
    /// read after which it may sleep, so a change is either seen by that
    /// read or announced afterwards. A source whose store announces every
    /// end has nothing to do (the default); PostgreSQL announces only the
    /// records a waiter marked, because a `NOTIFY` serialises every
    /// committing transaction that sent one (docs/design.md#waiting).
    async fn expect_end(&self, _record: &RecordId) -> Result<(), crate::StoreError> {
        Ok(())
    }
}

/// The pause before a notification source (a listening connection, a
/// subscriber, a watch) tries again after `failures` failures in a row:
/// `min_ms` doubled once per failure (`min_ms` itself after a connection
/// that ended without failing), at most `max_ms`.
/// Meanwhile the waiters' fallback poll covers what nobody heard.
pub fn reconnect_delay(failures: u32, min_ms: u64, max_ms: u64) -> Duration {
    let doubled = min_ms.saturating_mul(1 << failures.min(16));
    Duration::from_millis(doubled.min(max_ms))
}

/// Stops what [`ChangeSource::watch_record`] started when dropped.
#[must_use]
pub struct WatchGuard(Option<Box<dyn FnOnce() + Send>>);

impl WatchGuard {
    /// Nothing to stop (a source with one listener for every record).
    pub fn none() -> Self {
        Self(None)
    }

    pub fn on_drop(stop: impl FnOnce() + Send + 'static) -> Self {
        Self(Some(Box::new(stop)))
    }
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        if let Some(stop) = self.0.take() {
            stop();
        }
    }
}

/// A handle a notification source keeps to wake the hub's waiters without
/// keeping the hub alive: once the store is gone its calls do nothing.
#[derive(Clone)]
pub struct ChangeNotifier(Weak<HubInner>);

impl ChangeNotifier {
    /// `record` may have changed. Returns false once the hub is gone, so a
    /// listener task knows to stop.
    pub fn notify(&self, record: &RecordId) -> bool {
        match self.0.upgrade() {
            Some(inner) => {
                inner.notify(record);
                true
            }
            None => false,
        }
    }

    /// Notifications may have been lost (a listener reconnected): wake every
    /// waiter once so each reads its record again.
    pub fn notify_all(&self) -> bool {
        match self.0.upgrade() {
            Some(inner) => {
                inner.notify_all();
                true
            }
            None => false,
        }
    }

    /// Whether the hub still exists.
    pub fn is_alive(&self) -> bool {
        self.0.strong_count() > 0
    }
}

/// The waiters of one store instance, and how they are woken. Cheap to
/// clone: clones share the registry.
#[derive(Clone, Default)]
pub struct ChangeHub {
    inner: Arc<HubInner>,
}

#[derive(Default)]
struct HubInner {
    limits: Mutex<WaitLimits>,
    state: Mutex<HubState>,
    source: OnceLock<Arc<dyn ChangeSource>>,
    notifications: AtomicU64,
}

#[derive(Default)]
struct HubState {
    records: HashMap<RecordId, Watched>,
    waiters: usize,
    /// Waiters per caller; an entry lives while its caller has one.
    callers: HashMap<CallerId, usize>,
}

/// One waited record: its channel, its local waiters, and what its source
/// started for it.
struct Watched {
    changes: watch::Sender<u64>,
    waiters: usize,
    _source_watch: WatchGuard,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing here can leave the state half-changed on a panic, so a
    // poisoned lock is still consistent.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl HubInner {
    fn notify(&self, record: &RecordId) {
        self.notifications.fetch_add(1, Ordering::Relaxed);
        if let Some(watched) = lock(&self.state).records.get(record) {
            watched
                .changes
                .send_modify(|version| *version = version.wrapping_add(1));
        }
    }

    fn notify_all(&self) {
        for watched in lock(&self.state).records.values() {
            watched
                .changes
                .send_modify(|version| *version = version.wrapping_add(1));
        }
    }

    fn unsubscribe(&self, record: &RecordId) {
        let mut state = lock(&self.state);
        state.waiters = state.waiters.saturating_sub(1);
        if let Some(count) = state.callers.get_mut(&record.caller) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                state.callers.remove(&record.caller);
            }
        }
        let last = match state.records.get_mut(record) {
            Some(watched) => {
                watched.waiters = watched.waiters.saturating_sub(1);
                watched.waiters == 0
            }
            None => false,
        };
        if last {
            // Dropped under the lock, so the source sees stop and start of
            // one record in the order they happened.
            state.records.remove(record);
        }
    }
}

impl ChangeHub {
    pub fn new() -> Self {
        Self::default()
    }

    /// A hub whose records other processes also write, through `source`.
    pub fn with_source(source: Arc<dyn ChangeSource>) -> Self {
        let hub = Self::new();
        hub.set_source(source);
        hub
    }

    /// Sets the notification source once (a store built over an engine
    /// that already has a hub); false when one was set before, which stays.
    pub fn set_source(&self, source: Arc<dyn ChangeSource>) -> bool {
        self.inner.source.set(source).is_ok()
    }

    pub fn set_limits(&self, limits: WaitLimits) {
        *lock(&self.inner.limits) = limits;
    }

    pub fn limits(&self) -> WaitLimits {
        *lock(&self.inner.limits)
    }

    /// A handle for a notification source.
    pub fn notifier(&self) -> ChangeNotifier {
        ChangeNotifier(Arc::downgrade(&self.inner))
    }

    /// `record` may have changed: wake its local waiters. Backends call it
    /// after their own writes that end a started state.
    pub fn notify(&self, record: &RecordId) {
        self.inner.notify(record);
    }

    /// Wakes every waiter once.
    pub fn notify_all(&self) {
        self.inner.notify_all();
    }

    /// Whether `other` is a clone of this hub (the same registry).
    pub fn is_shared_with(&self, other: &ChangeHub) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Waiters registered now, for metrics and tests.
    pub fn waiters(&self) -> usize {
        lock(&self.inner.state).waiters
    }

    /// Records with at least one waiter now.
    pub fn waited_records(&self) -> usize {
        lock(&self.inner.state).records.len()
    }

    /// Notifications received since the hub was made, for metrics and tests.
    pub fn notifications(&self) -> u64 {
        self.inner.notifications.load(Ordering::Relaxed)
    }

    /// Registers a waiter on (caller, key). Subscribe first, then read the
    /// record: see the module's note on lost wake-ups.
    pub fn subscribe(&self, caller: &CallerId, key: &IdempotencyKey) -> Result<RecordWatch, WaitRefused> {
        self.subscribe_record(RecordId::new(caller, key))
    }

    pub fn subscribe_record(&self, record: RecordId) -> Result<RecordWatch, WaitRefused> {
        let limits = self.limits();
        let mut state = lock(&self.inner.state);
        if state.waiters >= limits.waiters_per_instance_max {
            return Err(WaitRefused::TooManyWaitersOnInstance(limits.waiters_per_instance_max));
        }
        let callers_waiters = state.callers.get(&record.caller).copied().unwrap_or(0);
        if callers_waiters >= limits.waiters_per_caller_max {
            return Err(WaitRefused::TooManyWaitersOfCaller(limits.waiters_per_caller_max));
        }
        let receiver = match state.records.get_mut(&record) {
            Some(watched) if watched.waiters >= limits.waiters_per_key_max => {
                return Err(WaitRefused::TooManyWaitersOnKey(limits.waiters_per_key_max));
            }
            Some(watched) => {
                watched.waiters += 1;
                watched.changes.subscribe()
            }
            None => {
                let (changes, receiver) = watch::channel(0);
                let source_watch = match self.inner.source.get() {
                    Some(source) => source.watch_record(&record, self.notifier()),
                    None => WatchGuard::none(),
                };
                state.records.insert(
                    record.clone(),
                    Watched {
                        changes,
                        waiters: 1,
                        _source_watch: source_watch,
                    },
                );
                receiver
            }
        };
        state.waiters += 1;
        *state.callers.entry(record.caller.clone()).or_insert(0) += 1;
        Ok(RecordWatch {
            hub: Arc::clone(&self.inner),
            record,
            receiver,
            poll_interval: Duration::from_millis(limits.poll_interval_ms),
        })
    }
}

/// One waiter on one record. Dropping it (a client that hung up drops its
/// request's future, and this with it) frees its place under the caps.
pub struct RecordWatch {
    hub: Arc<HubInner>,
    record: RecordId,
    receiver: watch::Receiver<u64>,
    poll_interval: Duration,
}

impl RecordWatch {
    pub fn record(&self) -> &RecordId {
        &self.record
    }

    /// Asks the hub's source to announce the end of this record's started
    /// state ([`ChangeSource::expect_end`]); call it before the read after
    /// which the waiter may sleep.
    pub async fn expect_end(&self) -> Result<(), crate::StoreError> {
        match self.hub.source.get() {
            Some(source) => source.expect_end(&self.record).await,
            None => Ok(()),
        }
    }

    /// Waits until the record may have changed, the poll interval passed, or
    /// `until`, whichever is first. A notification that came since the
    /// subscription (or the last call) returns at once.
    pub async fn changed(&mut self, until: Instant) -> Woken {
        if self.receiver.has_changed().unwrap_or(true) {
            self.receiver.borrow_and_update();
            return Woken::Notified;
        }
        let now = Instant::now();
        if now >= until {
            return Woken::DeadlinePassed;
        }
        let poll_at = now + self.poll_interval;
        let wake_at = poll_at.min(until);
        tokio::select! {
            // An error means the sender is gone, which cannot happen while
            // this watch is registered; reading the record again is safe.
            _ = self.receiver.changed() => Woken::Notified,
            () = tokio::time::sleep_until(wake_at) => {
                if wake_at >= until { Woken::DeadlinePassed } else { Woken::PollDue }
            }
        }
    }
}

impl Drop for RecordWatch {
    fn drop(&mut self) {
        self.hub.unsubscribe(&self.record);
    }
}

impl fmt::Debug for RecordWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordWatch")
            .field("record", &self.record)
            .finish_non_exhaustive()
    }
}

/// What [`claim_waiting`] ended with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitedClaim {
    /// The key is no longer in progress: a replay of the saved response, a
    /// mismatch, or `Acquired` — the earlier attempt released or abandoned
    /// the key (or its lease ran out) and this request is now the attempt
    /// that runs.
    Decided(ClaimOutcome),
    /// Still in progress at the deadline: answer 409 as without waiting.
    StillInProgress { retry_after_ms: u64 },
    /// `stop` completed while waiting (the client hung up): nothing was
    /// claimed, and the waiter's place is free.
    Stopped { retry_after_ms: u64 },
    /// Not allowed to wait (a cap, or a store that cannot wake waiters):
    /// answer 409 at once.
    Refused { retry_after_ms: u64, reason: WaitRefused },
}

/// Claims the key, and while another attempt holds it, waits until
/// `until` for that attempt to end (docs/design.md#waiting).
///
/// The loop: claim; if in progress, subscribe, ask the store to announce
/// the record's end ([`RecordWatch::expect_end`]), claim again (the read
/// after the subscription), and sleep until a notification, the poll interval, the
/// holder's lease end (a takeover is possible then) or `until`; claim again.
/// Every claim re-sends `request` with its one token, so a waiter that
/// becomes the new attempt is an ordinary claim with a fresh lease, and of
/// many waiters the store lets exactly one acquire.
///
/// `stop` ends the waiting (a client that hung up): it interrupts only the
/// sleep between claims, never a claim, so a claim that acquired the key is
/// always reported and its attempt can run to its end (ARCHITECTURE.md, "A
/// started claim runs to its end"). Run this in the task that owns the
/// attempt and pass the hang-up signal as `stop`; dropping the future also
/// frees the waiter's place, but may drop an acquired claim with it.
pub async fn claim_waiting(
    store: &dyn IdempotencyStore,
    request: &ClaimRequest,
    until: Instant,
    stop: impl Future<Output = ()>,
) -> Result<WaitedClaim, StoreError> {
    let mut stop = std::pin::pin!(stop);
    let retry_after_ms = match store.claim(request).await? {
        ClaimOutcome::InProgress { retry_after_ms } => retry_after_ms,
        decided => return Ok(WaitedClaim::Decided(decided)),
    };
    let Some(hub) = store.record_changes() else {
        return Ok(WaitedClaim::Refused {
            retry_after_ms,
            reason: WaitRefused::NotSupported,
        });
    };
    let mut watch = match hub.subscribe(&request.caller, &request.key) {
        Ok(watch) => watch,
        Err(reason) => return Ok(WaitedClaim::Refused { retry_after_ms, reason }),
    };
    loop {
        watch.expect_end().await?;
        let retry_after_ms = match store.claim(request).await? {
            ClaimOutcome::InProgress { retry_after_ms } => retry_after_ms,
            decided => return Ok(WaitedClaim::Decided(decided)),
        };
        if Instant::now() >= until {
            return Ok(WaitedClaim::StillInProgress { retry_after_ms });
        }
        let lease_end = Instant::now() + Duration::from_millis(retry_after_ms);
        let woken = tokio::select! {
            woken = watch.changed(until.min(lease_end)) => woken,
            () = &mut stop => return Ok(WaitedClaim::Stopped { retry_after_ms }),
        };
        if woken == Woken::DeadlinePassed && Instant::now() >= until {
            // One last read: the change may have landed just now.
            return match store.claim(request).await? {
                ClaimOutcome::InProgress { retry_after_ms } => Ok(WaitedClaim::StillInProgress { retry_after_ms }),
                decided => Ok(WaitedClaim::Decided(decided)),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(n: u8) -> RecordId {
        RecordId {
            caller: CallerId::new("fulfilment").unwrap(),
            digest: KeyDigest([n; 32]),
        }
    }

    fn limits(per_key: usize, per_instance: usize, poll_ms: u64) -> WaitLimits {
        WaitLimits::new(per_key, per_instance, poll_ms).unwrap()
    }

    #[test]
    fn tags_round_trip_and_refuse_anything_else() {
        let id = record(0xab);
        assert_eq!(RecordId::from_tag(&id.tag()), Some(id.clone()));
        assert_eq!(id.tag().len(), "fulfilment".len() + 1 + 64);
        for bad in [
            "",
            "fulfilment",
            "fulfilment:zz",
            "bad caller:00",
            &format!("x:{}", "0".repeat(62)),
        ] {
            assert_eq!(RecordId::from_tag(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_reconnect_delay_doubles_from_its_floor_up_to_its_cap() {
        let delays: Vec<u64> = [0, 1, 2, 3, 40]
            .into_iter()
            .map(|failures| reconnect_delay(failures, 50, 2_000).as_millis() as u64)
            .collect();
        assert_eq!(delays, [50, 100, 200, 400, 2_000]);
    }

    #[test]
    fn limits_that_cannot_work_are_refused() {
        assert_eq!(WaitLimits::new(0, 10, 100), Err(InvalidWaitLimits::ZeroCap));
        assert!(matches!(
            WaitLimits::new(11, 10, 100),
            Err(InvalidWaitLimits::KeyCapAboveInstanceCap { .. })
        ));
        assert_eq!(
            WaitLimits::new(1, 10, WAIT_POLL_INTERVAL_MS_MIN - 1),
            Err(InvalidWaitLimits::PollInterval(WAIT_POLL_INTERVAL_MS_MIN - 1))
        );
        assert!(WaitLimits::new(1, 1, WAIT_POLL_INTERVAL_MS_MAX).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_notification_before_the_wait_is_not_lost() {
        let hub = ChangeHub::new();
        let mut watch = hub.subscribe_record(record(1)).unwrap();
        hub.notify(&record(1));
        let until = Instant::now() + Duration::from_secs(10);
        assert_eq!(watch.changed(until).await, Woken::Notified);
    }

    #[tokio::test(start_paused = true)]
    async fn one_notification_wakes_every_waiter_of_that_record_only() {
        let hub = ChangeHub::new();
        hub.set_limits(limits(10, 10, WAIT_POLL_INTERVAL_MS_MAX));
        let mut on_one: Vec<_> = (0..3).map(|_| hub.subscribe_record(record(1)).unwrap()).collect();
        let mut on_two = hub.subscribe_record(record(2)).unwrap();
        hub.notify(&record(1));
        let until = Instant::now() + Duration::from_millis(500);
        for watch in &mut on_one {
            assert_eq!(watch.changed(until).await, Woken::Notified);
        }
        assert_eq!(on_two.changed(until).await, Woken::DeadlinePassed);
    }

    #[tokio::test(start_paused = true)]
    async fn with_no_notification_the_poll_wakes_the_waiter_each_interval() {
        let hub = ChangeHub::new();
        hub.set_limits(limits(10, 10, 250));
        let mut watch = hub.subscribe_record(record(1)).unwrap();
        let started = Instant::now();
        let until = started + Duration::from_secs(10);
        assert_eq!(watch.changed(until).await, Woken::PollDue);
        assert_eq!(started.elapsed(), Duration::from_millis(250));
        assert_eq!(
            watch.changed(started + Duration::from_millis(400)).await,
            Woken::DeadlinePassed
        );
        assert_eq!(started.elapsed(), Duration::from_millis(400));
    }

    #[test]
    fn caps_refuse_at_once_and_a_dropped_waiter_frees_its_place() {
        let hub = ChangeHub::new();
        hub.set_limits(limits(2, 3, 100));
        let a1 = hub.subscribe_record(record(1)).unwrap();
        let _a2 = hub.subscribe_record(record(1)).unwrap();
        assert_eq!(
            hub.subscribe_record(record(1)).unwrap_err(),
            WaitRefused::TooManyWaitersOnKey(2)
        );
        let _b1 = hub.subscribe_record(record(2)).unwrap();
        assert_eq!(
            hub.subscribe_record(record(3)).unwrap_err(),
            WaitRefused::TooManyWaitersOnInstance(3)
        );
        assert_eq!(hub.waiters(), 3);
        drop(a1);
        assert_eq!(hub.waiters(), 2);
        let _a3 = hub.subscribe_record(record(1)).unwrap();
    }

    #[test]
    fn one_callers_waiters_are_capped_and_another_caller_still_waits() {
        let hub = ChangeHub::new();
        hub.set_limits(limits(8, 8, 100).with_waiters_per_caller_max(2).unwrap());
        let of = |caller: &str, n: u8| RecordId {
            caller: CallerId::new(caller).unwrap(),
            digest: KeyDigest([n; 32]),
        };
        let first = hub.subscribe_record(of("greedy", 1)).unwrap();
        let _second = hub.subscribe_record(of("greedy", 2)).unwrap();
        assert_eq!(
            hub.subscribe_record(of("greedy", 3)).unwrap_err(),
            WaitRefused::TooManyWaitersOfCaller(2)
        );
        let _other = hub.subscribe_record(of("polite", 1)).unwrap();
        drop(first);
        let _third = hub.subscribe_record(of("greedy", 3)).unwrap();
        assert_eq!(hub.waiters(), 3);
        assert_eq!(
            limits(2, 8, 100).with_waiters_per_caller_max(9),
            Err(InvalidWaitLimits::CallerCapAboveInstanceCap {
                per_caller: 9,
                per_instance: 8
            })
        );
    }

    struct CountingSource(Arc<Mutex<Vec<String>>>);

    impl ChangeSource for CountingSource {
        fn watch_record(&self, record: &RecordId, _notifier: ChangeNotifier) -> WatchGuard {
            let log = Arc::clone(&self.0);
            lock(&log).push(format!("start {}", record.digest.0[0]));
            let digest = record.digest.0[0];
            WatchGuard::on_drop(move || lock(&log).push(format!("stop {digest}")))
        }
    }

    #[test]
    fn the_source_watches_a_record_from_its_first_waiter_to_its_last() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let hub = ChangeHub::with_source(Arc::new(CountingSource(Arc::clone(&log))));
        let first = hub.subscribe_record(record(7)).unwrap();
        let second = hub.subscribe_record(record(7)).unwrap();
        drop(first);
        assert_eq!(*lock(&log), vec!["start 7"]);
        drop(second);
        assert_eq!(*lock(&log), vec!["start 7", "stop 7"]);
        assert_eq!(hub.waited_records(), 0);
        let _again = hub.subscribe_record(record(7)).unwrap();
        assert_eq!(lock(&log).len(), 3);
    }

    #[test]
    fn a_notifier_outliving_its_hub_reports_it_gone() {
        let hub = ChangeHub::new();
        let notifier = hub.notifier();
        assert!(notifier.notify(&record(1)));
        drop(hub);
        assert!(!notifier.notify(&record(1)) && !notifier.is_alive());
    }
}
