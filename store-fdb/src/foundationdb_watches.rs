//! FoundationDB watches as the notification source of waiting
//! (docs/design.md#waiting), feature `foundationdb`.
//!
//! While a record has local waiters, one task per record keeps a watch on
//! the record's first chunk key: every write that ends a started state
//! rewrites or clears that chunk (the state and the lease are at the front of
//! the encoded record), so the watch fires on a completion, a release or an
//! abandon by any process. The task arms the watch in a transaction of its
//! own, and only once that transaction has committed does it wake the
//! record's waiters: a change committed before the arming is then read by
//! the waiters, a change after it fires the watch. After the watch fires the
//! task arms a new one and wakes the waiters again. When the last waiter
//! leaves, the task is aborted, and with it the watch (a dropped watch
//! future cancels it).
//!
//! A watch that fails (a lost connection, `too_many_watches`) is armed
//! again after a pause that doubles up to `WATCH_RETRY_DELAY_MS_MAX`; the
//! waiters' fallback poll covers the gap.

use crate::keys::KeyLayout;
use ::foundationdb::{Database, FdbError};
use std::future::Future;
use std::sync::Arc;
use store_core::{ChangeNotifier, ChangeSource, RecordId, WatchGuard, reconnect_delay};

/// First pause before arming a watch again after a failure.
pub const WATCH_RETRY_DELAY_MS_MIN: u64 = 50;
/// Longest pause between attempts to arm a watch.
pub const WATCH_RETRY_DELAY_MS_MAX: u64 = 2_000;

/// One watch task per waited record, over one database handle.
pub(crate) struct RecordWatches {
    database: Arc<Database>,
    layout: KeyLayout,
}

impl RecordWatches {
    pub(crate) fn new(database: Arc<Database>, layout: KeyLayout) -> Self {
        Self { database, layout }
    }
}

impl ChangeSource for RecordWatches {
    fn watch_record(&self, record: &RecordId, notifier: ChangeNotifier) -> WatchGuard {
        let slot = self.layout.slot(&record.caller, record.digest);
        let key = self.layout.record_chunk_key(&slot, 0);
        let task = tokio::spawn(keep_watching(Arc::clone(&self.database), key, record.clone(), notifier));
        WatchGuard::on_drop(move || task.abort())
    }
}

/// Arms a watch, wakes the waiters, waits for the watch to fire; again,
/// until aborted or the hub is gone.
async fn keep_watching(database: Arc<Database>, key: Vec<u8>, record: RecordId, notifier: ChangeNotifier) {
    let mut failures: u32 = 0;
    loop {
        let fired = match arm_watch(&database, &key).await {
            Ok(watch) => {
                failures = 0;
                if !notifier.notify(&record) {
                    return;
                }
                watch.await
            }
            Err(error) => Err(error),
        };
        if let Err(error) = fired {
            failures = failures.saturating_add(1);
            tracing::debug!(%record, %error, failures, "a FoundationDB watch failed; waiters poll until it is armed again");
            tokio::time::sleep(reconnect_delay(
                failures,
                WATCH_RETRY_DELAY_MS_MIN,
                WATCH_RETRY_DELAY_MS_MAX,
            ))
            .await;
        }
    }
}

/// Registers a watch on `key` in a transaction and commits it: the watch
/// then reports any change after the commit's version.
async fn arm_watch(database: &Database, key: &[u8]) -> Result<impl Future<Output = Result<(), FdbError>>, FdbError> {
    let transaction = database.create_trx()?;
    let watch = transaction.watch(key);
    transaction.commit().await.map_err(FdbError::from)?;
    Ok(watch)
}
