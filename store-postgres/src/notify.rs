//! PostgreSQL `LISTEN/NOTIFY` as the notification source of waiting
//! (docs/design.md#waiting).
//!
//! The store's writes notify through triggers (migration 0002): channel
//! [`CHANGES_CHANNEL`], payload `caller:hex key digest`, sent at commit in
//! the transaction of the write. Each store instance keeps one dedicated
//! connection (outside the pool, named [`LISTENER_APPLICATION_NAME`]) that
//! listens on the channel and hands every notification to the store's
//! [`ChangeHub`](store_core::ChangeHub), which wakes that record's local
//! waiters. The connection is opened when the first waiter arrives, not
//! before: a server that never waits keeps no extra connection.
//!
//! A `NOTIFY` is costly: the transaction that sent one holds a
//! database-wide lock until after its commit, so notifying transactions
//! commit one at a time. The triggers (migration 0003) therefore notify only
//! the end of a record a waiter marked: before each read after which it may
//! sleep, a waiter sets the row's `watched` flag through
//! [`ChangeSource::expect_end`] (one `UPDATE` on the pool, which changes
//! nothing once the flag is set or the record is no longer started).
//!
//! When the connection fails it is opened again after a pause that doubles
//! up to [`LISTENER_RETRY_DELAY_MS_MAX`]; meanwhile the waiters' fallback
//! poll covers the notifications that nobody heard. Each time `LISTEN`
//! succeeds, every waiter is woken once to read its record again, since
//! notifications sent before that were lost.

use crate::config::ListenerTls;
use crate::error::{pool_error, store_error};
use async_trait::async_trait;
use deadpool_postgres::Pool;
use std::future::poll_fn;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;
use store_core::{ChangeNotifier, ChangeSource, RecordId, StoreError, WatchGuard, reconnect_delay};
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, NoTls};

/// The channel the triggers notify on.
pub const CHANGES_CHANNEL: &str = "idem_record_changed";
/// `application_name` of the listening connection, to tell it apart in
/// `pg_stat_activity`.
pub const LISTENER_APPLICATION_NAME: &str = "idem-listener";
/// First pause before opening the listening connection again.
pub const LISTENER_RETRY_DELAY_MS_MIN: u64 = 50;
/// Longest pause between attempts to open the listening connection.
pub const LISTENER_RETRY_DELAY_MS_MAX: u64 = 2_000;
/// TCP keepalive idle time of the listening connection: a connection that
/// died silently (a partition) is noticed within about this, instead of the
/// kernel's two hours, and the poll covers the waiters until then.
pub const LISTENER_KEEPALIVE_IDLE_MS: u64 = 30_000;

/// Marks a started record as waited for, so that its end is notified.
const MARK_WAITED: &str = "UPDATE idempotency_keys SET watched = true \
     WHERE caller_id = $1 AND idem_key = $2 AND state = 'started' AND NOT watched";

/// The listening task of one store instance, started by the first waiter,
/// and the store's pool, on which waiters mark the records they wait for.
pub(crate) struct ChangeListener {
    config: tokio_postgres::Config,
    tls: ListenerTls,
    task: Mutex<Option<JoinHandle<()>>>,
    pool: Pool,
    operation_timeout: Duration,
}

impl ChangeListener {
    pub(crate) fn new(
        mut config: tokio_postgres::Config,
        tls: ListenerTls,
        pool: Pool,
        operation_timeout: Duration,
    ) -> Self {
        config
            .application_name(LISTENER_APPLICATION_NAME)
            .keepalives(true)
            .keepalives_idle(Duration::from_millis(LISTENER_KEEPALIVE_IDLE_MS));
        Self {
            config,
            tls,
            task: Mutex::new(None),
            pool,
            operation_timeout,
        }
    }

    async fn mark_waited(&self, record: &RecordId) -> Result<(), StoreError> {
        let connection = self.pool.get().await.map_err(pool_error)?;
        let statement = connection.prepare_cached(MARK_WAITED).await.map_err(store_error)?;
        let key_digest = record.digest.0.as_slice();
        connection
            .execute(&statement, &[&record.caller.as_str(), &key_digest])
            .await
            .map_err(store_error)?;
        Ok(())
    }
}

#[async_trait]
impl ChangeSource for ChangeListener {
    fn watch_record(&self, _record: &RecordId, notifier: ChangeNotifier) -> WatchGuard {
        let mut task = self.task.lock().unwrap_or_else(PoisonError::into_inner);
        let running = task.as_ref().is_some_and(|task| !task.is_finished());
        // Outside a runtime there is nothing to spawn on; the waiters poll.
        if !running && let Ok(runtime) = tokio::runtime::Handle::try_current() {
            *task = Some(runtime.spawn(listen_while_alive(self.config.clone(), self.tls.clone(), notifier)));
        }
        WatchGuard::none()
    }

    async fn expect_end(&self, record: &RecordId) -> Result<(), StoreError> {
        match tokio::time::timeout(self.operation_timeout, self.mark_waited(record)).await {
            Ok(marked) => marked,
            Err(_elapsed) => Err(StoreError::Unavailable {
                detail: format!(
                    "marking a waited record did not finish within {:?}",
                    self.operation_timeout
                ),
                source: None,
            }),
        }
    }
}

impl Drop for ChangeListener {
    fn drop(&mut self) {
        if let Some(task) = self.task.get_mut().unwrap_or_else(PoisonError::into_inner).take() {
            task.abort();
        }
    }
}

/// Listens, and listens again after each failure, until the store is gone.
async fn listen_while_alive(config: tokio_postgres::Config, tls: ListenerTls, notifier: ChangeNotifier) {
    let mut failures: u32 = 0;
    while notifier.is_alive() {
        let listened = match &tls {
            ListenerTls::Plain => match config.connect(NoTls).await {
                Ok((client, connection)) => listen(client, connection, &notifier).await,
                Err(error) => Err(error),
            },
            ListenerTls::Rustls(connector) => match config.connect(connector.clone()).await {
                Ok((client, connection)) => listen(client, connection, &notifier).await,
                Err(error) => Err(error),
            },
        };
        match listened {
            Ok(()) => failures = 0,
            Err(error) => {
                failures = failures.saturating_add(1);
                tracing::warn!(%error, failures, "the postgresql change listener failed; waiters poll until it listens again");
            }
        }
        tokio::time::sleep(reconnect_delay(
            failures,
            LISTENER_RETRY_DELAY_MS_MIN,
            LISTENER_RETRY_DELAY_MS_MAX,
        ))
        .await;
    }
}

/// One connection's life: `LISTEN`, wake every waiter, then hand on each
/// notification until the connection ends or the store is gone.
async fn listen<Stream>(
    client: tokio_postgres::Client,
    mut connection: tokio_postgres::Connection<tokio_postgres::Socket, Stream>,
    notifier: &ChangeNotifier,
) -> Result<(), tokio_postgres::Error>
where
    Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let statement = format!("LISTEN {CHANGES_CHANNEL}");
    let listen = client.batch_execute(&statement);
    tokio::pin!(listen);
    // The connection must be driven for LISTEN to be answered.
    loop {
        tokio::select! {
            answer = &mut listen => { answer?; break; }
            message = poll_fn(|context| connection.poll_message(context)) => {
                match message {
                    Some(Ok(message)) => {
                        if !hand_on(message, notifier) {
                            return Ok(());
                        }
                    }
                    Some(Err(error)) => return Err(error),
                    None => return Ok(()),
                }
            }
        }
    }
    tracing::debug!("the postgresql change listener is listening");
    notifier.notify_all();
    while let Some(message) = poll_fn(|context| connection.poll_message(context)).await {
        if !hand_on(message?, notifier) {
            return Ok(());
        }
    }
    Ok(())
}

/// Wakes the waiters of the record a notification names; false once the
/// store is gone.
fn hand_on(message: AsyncMessage, notifier: &ChangeNotifier) -> bool {
    let AsyncMessage::Notification(notification) = message else {
        return notifier.is_alive();
    };
    match RecordId::from_tag(notification.payload()) {
        Some(record) => notifier.notify(&record),
        None => {
            tracing::warn!(
                payload = notification.payload(),
                "a notification on the change channel names no record"
            );
            notifier.is_alive()
        }
    }
}
