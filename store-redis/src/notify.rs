//! Redis pub/sub as the notification source of waiting
//! (docs/design.md#waiting).
//!
//! The scripts that end a started state (complete, release, abandon) publish
//! on the record's own channel, `{prefix}{caller:digest}:changed`, in the
//! script, so the message leaves with the write or not at all. The channel
//! carries the record's hash tag: on Redis Cluster the scripts use sharded
//! pub/sub (`SPUBLISH`, Redis 7), so a message travels only to the shard
//! that owns the record's slot instead of across the whole cluster bus as a
//! plain `PUBLISH` would; on a standalone server they use `PUBLISH`
//! (redis-rs 1.8 subscribes to sharded channels only on cluster
//! connections, and on one server the two cost the same).
//!
//! Each store instance keeps one subscriber connection (RESP3, its pushes
//! on a channel of their own), opened when the first waiter arrives. One
//! task owns it and subscribes to a record's channel when the record gets
//! its first local waiter and unsubscribes when the last one leaves. What
//! the hub asks is kept as the state it wants, not as a queue of requests
//! ([`Subscriptions`]): at most one change per channel waits to be made,
//! the last asked (so a quick leave-and-return never ends unsubscribed),
//! and a change the connection already reflects is dropped. So while the
//! connection cannot be opened (Redis down for minutes while waiters come
//! and go), what waits is bounded by the channels subscribed and the
//! records with waiters (which the hub caps), never by the traffic.
//! Every confirmation of a subscription (the first, and the ones redis-rs
//! sends again when it resubscribes after a reconnection or a slot move)
//! wakes that record's waiters, so a change published before the
//! subscription held is read then; a message lost while the connection was
//! down is covered by the waiters' fallback poll.

use crate::config::RedisConfig;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{ProtocolVersion, PushInfo, PushKind, RedisResult, TlsCertificates, Value};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use store_core::{ChangeNotifier, ChangeSource, RecordId, WatchGuard, reconnect_delay};
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;

/// The suffix of a record's change channel, after its hash tag.
pub const CHANGE_CHANNEL_SUFFIX: &str = ":changed";
/// First pause before opening the subscriber connection again.
pub const SUBSCRIBER_RETRY_DELAY_MS_MIN: u64 = 50;
/// Longest pause between attempts to open the subscriber connection.
pub const SUBSCRIBER_RETRY_DELAY_MS_MAX: u64 = 2_000;

/// How the scripts publish: the next-to-last script argument.
pub(crate) fn publish_mode(cluster: bool) -> &'static str {
    if cluster { "sharded" } else { "plain" }
}

/// The record a change channel names, read from its hash tag.
pub fn record_of_channel(channel: &str) -> Option<RecordId> {
    let inside = channel.strip_suffix(CHANGE_CHANNEL_SUFFIX)?.strip_suffix('}')?;
    let (_, tag) = inside.rsplit_once('{')?;
    RecordId::from_tag(tag)
}

/// The channels the hub wants the connection subscribed to, as changes
/// still to make, and the channels it is subscribed to.
#[derive(Default)]
struct Wanted {
    /// Subscribed on the connection (as the task last made it).
    subscribed: HashSet<String>,
    /// Changes not made yet: a channel, and whether it is to be subscribed.
    /// Only channels whose wanted state differs from `subscribed`.
    pending: HashMap<String, bool>,
}

/// What the hub wants, shared by the watch guards that change it and the
/// task that makes it so.
#[derive(Default)]
struct Subscriptions {
    wanted: Mutex<Wanted>,
    /// Signalled after each change of `wanted`.
    changed: Notify,
}

impl Subscriptions {
    fn lock(&self) -> MutexGuard<'_, Wanted> {
        self.wanted.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The hub wants `channel` subscribed (or not): a change to make, or
    /// none when the connection already is (or is not).
    fn want(&self, channel: String, subscribed: bool) {
        let mut wanted = self.lock();
        if wanted.subscribed.contains(&channel) == subscribed {
            wanted.pending.remove(&channel);
        } else {
            wanted.pending.insert(channel, subscribed);
        }
        drop(wanted);
        self.changed.notify_one();
    }

    /// A change to make now, if any.
    fn next_change(&self) -> Option<(String, bool)> {
        let mut wanted = self.lock();
        let channel = wanted.pending.keys().next()?.clone();
        wanted.pending.remove_entry(&channel)
    }

    /// The connection is now subscribed to `channel` (or not).
    fn made(&self, channel: &str, subscribed: bool) {
        let mut wanted = self.lock();
        if subscribed {
            wanted.subscribed.insert(channel.to_owned());
        } else {
            wanted.subscribed.remove(channel);
        }
    }

    /// Changes waiting to be made.
    #[cfg(test)]
    fn pending(&self) -> usize {
        self.lock().pending.len()
    }
}

/// The subscriber of one store instance.
pub(crate) struct ChangeSubscriber {
    config: RedisConfig,
    /// The store's own, so the subscriber connects over TLS as it does.
    certificates: Option<TlsCertificates>,
    prefix: String,
    subscriptions: Arc<Subscriptions>,
    running: Mutex<Option<JoinHandle<()>>>,
}

impl ChangeSubscriber {
    pub(crate) fn new(config: RedisConfig, certificates: Option<TlsCertificates>) -> Self {
        Self {
            prefix: config.key_prefix.clone(),
            config,
            certificates,
            subscriptions: Arc::default(),
            running: Mutex::new(None),
        }
    }

    /// Starts the task if it is not running; false outside a runtime (the
    /// waiters then poll).
    fn ensure_running(&self, notifier: &ChangeNotifier) -> bool {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        if running.as_ref().is_some_and(|task| !task.is_finished()) {
            return true;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let task = runtime.spawn(subscribe_while_alive(
            self.config.clone(),
            self.certificates.clone(),
            self.subscriptions.clone(),
            notifier.clone(),
        ));
        *running = Some(task);
        true
    }

    /// Subscription changes waiting to be made (for tests).
    #[cfg(test)]
    fn pending_changes(&self) -> usize {
        self.subscriptions.pending()
    }
}

impl ChangeSource for ChangeSubscriber {
    fn watch_record(&self, record: &RecordId, notifier: ChangeNotifier) -> WatchGuard {
        let channel = format!("{}{{{}}}{CHANGE_CHANNEL_SUFFIX}", self.prefix, record.tag());
        if !self.ensure_running(&notifier) {
            return WatchGuard::none();
        }
        self.subscriptions.want(channel.clone(), true);
        let subscriptions = self.subscriptions.clone();
        WatchGuard::on_drop(move || subscriptions.want(channel, false))
    }
}

impl Drop for ChangeSubscriber {
    fn drop(&mut self) {
        let running = self.running.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let Some(task) = running.take() {
            task.abort();
        }
    }
}

/// The subscriber connection, standalone or cluster.
enum Subscriber {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Subscriber {
    async fn open(
        config: &RedisConfig,
        certificates: Option<TlsCertificates>,
        pushes: mpsc::UnboundedSender<PushInfo>,
    ) -> RedisResult<Self> {
        if config.cluster {
            let mut builder = ClusterClientBuilder::new(config.urls.iter().map(String::as_str));
            if let Some(certificates) = certificates {
                builder = builder.certs(certificates);
            }
            let client = builder
                .use_protocol(ProtocolVersion::RESP3)
                .push_sender(pushes)
                .connection_timeout(config.connection_timeout())
                .response_timeout(config.response_timeout())
                .build()?;
            return Ok(Subscriber::Cluster(client.get_async_connection().await?));
        }
        let url = config.urls.first().map(String::as_str).unwrap_or_default();
        let client = redis::Client::open(url)?;
        let info = client.get_connection_info().clone();
        let settings = info.redis_settings().clone().set_protocol(ProtocolVersion::RESP3);
        let info = info.set_redis_settings(settings);
        let client = match certificates {
            Some(certificates) => redis::Client::build_with_tls(info, certificates)?,
            None => redis::Client::open(info)?,
        };
        let manager_config = ConnectionManagerConfig::new()
            .set_push_sender(pushes)
            .set_automatic_resubscription()
            .set_connection_timeout(Some(config.connection_timeout()))
            .set_response_timeout(Some(config.response_timeout()));
        Ok(Subscriber::Standalone(
            ConnectionManager::new_with_config(client, manager_config).await?,
        ))
    }

    async fn start(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            Subscriber::Standalone(manager) => manager.subscribe(channel).await,
            Subscriber::Cluster(cluster) => cluster.ssubscribe(channel).await,
        }
    }

    async fn stop(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            Subscriber::Standalone(manager) => manager.unsubscribe(channel).await,
            Subscriber::Cluster(cluster) => cluster.sunsubscribe(channel).await,
        }
    }
}

/// Opens the subscriber (again after each failure to open it), then makes
/// the hub's changes and hands on the pushes until the store is gone.
async fn subscribe_while_alive(
    config: RedisConfig,
    certificates: Option<TlsCertificates>,
    subscriptions: Arc<Subscriptions>,
    notifier: ChangeNotifier,
) {
    let (push_sender, mut pushes) = mpsc::unbounded_channel();
    let mut failures: u32 = 0;
    let mut subscriber = loop {
        match Subscriber::open(&config, certificates.clone(), push_sender.clone()).await {
            Ok(subscriber) => break subscriber,
            Err(error) => {
                failures = failures.saturating_add(1);
                tracing::warn!(%error, failures, "the redis change subscriber cannot connect; waiters poll meanwhile");
                tokio::time::sleep(reconnect_delay(
                    failures,
                    SUBSCRIBER_RETRY_DELAY_MS_MIN,
                    SUBSCRIBER_RETRY_DELAY_MS_MAX,
                ))
                .await;
                if !notifier.is_alive() {
                    return;
                }
            }
        }
    };
    loop {
        while let Some((channel, subscribe)) = subscriptions.next_change() {
            make(&mut subscriber, &subscriptions, &channel, subscribe, &notifier).await;
        }
        tokio::select! {
            () = subscriptions.changed.notified() => {
                if !notifier.is_alive() {
                    return;
                }
            }
            push = pushes.recv() => {
                let Some(push) = push else { return };
                if !hand_on(push, &notifier) {
                    return;
                }
            }
        }
    }
}

/// Subscribes to `channel` (or unsubscribes), and records what holds.
async fn make(
    subscriber: &mut Subscriber,
    subscriptions: &Subscriptions,
    channel: &str,
    subscribe: bool,
    notifier: &ChangeNotifier,
) {
    if subscribe {
        match subscriber.start(channel).await {
            // Subscribed: a change published before now is read now.
            Ok(()) => {
                subscriptions.made(channel, true);
                if let Some(record) = record_of_channel(channel) {
                    notifier.notify(&record);
                }
            }
            Err(error) => tracing::warn!(%error, "redis change subscription failed; its waiters poll"),
        }
        return;
    }
    match subscriber.stop(channel).await {
        Ok(()) => subscriptions.made(channel, false),
        Err(error) => tracing::debug!(%error, "redis change unsubscription failed"),
    }
}

/// Wakes the waiters of the record a push names: a message, or a
/// confirmed (re)subscription. False once the store is gone.
fn hand_on(push: PushInfo, notifier: &ChangeNotifier) -> bool {
    let names_a_record = matches!(
        push.kind,
        PushKind::Message | PushKind::SMessage | PushKind::Subscribe | PushKind::SSubscribe
    );
    let channel = match push.data.first() {
        Some(Value::BulkString(bytes)) if names_a_record => String::from_utf8_lossy(bytes).into_owned(),
        _ => return notifier.is_alive(),
    };
    match record_of_channel(&channel) {
        Some(record) => notifier.notify(&record),
        None => notifier.is_alive(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use store_core::{CallerId, IdempotencyKey};

    /// While the subscriber cannot connect, waiters that come and go leave
    /// nothing behind: only the records waited on now have a change waiting.
    #[tokio::test]
    async fn changes_wait_bounded_by_the_records_waited_on_while_redis_is_down() {
        let config = RedisConfig {
            // Port 1: nothing listens there, so the connection never opens.
            urls: vec!["redis://127.0.0.1:1".to_owned()],
            ..RedisConfig::default()
        };
        let subscriber = ChangeSubscriber::new(config, None);
        let hub = store_core::ChangeHub::new();
        let caller = CallerId::new("fulfilment").unwrap();
        for round in 0..1_000 {
            let key = IdempotencyKey::new(&format!("label:{round}")).unwrap();
            let guard = subscriber.watch_record(&RecordId::new(&caller, &key), hub.notifier());
            drop(guard);
        }
        let held: Vec<WatchGuard> = (0..3)
            .map(|round| {
                let key = IdempotencyKey::new(&format!("held:{round}")).unwrap();
                subscriber.watch_record(&RecordId::new(&caller, &key), hub.notifier())
            })
            .collect();
        assert_eq!(subscriber.pending_changes(), held.len());
    }

    #[test]
    fn a_channel_names_its_record_and_nothing_else_does() {
        let caller = CallerId::new("fulfilment").unwrap();
        let key = IdempotencyKey::new("label:1:1:v1").unwrap();
        let keys = crate::RecordKeys::new("idem:", &caller, &key);
        assert_eq!(record_of_channel(&keys.changes), Some(RecordId::new(&caller, &key)));
        for other in [
            "",
            ":changed",
            "idem:{fulfilment}:changed",
            &keys.record,
            "idem:{x:00}:changed",
        ] {
            assert_eq!(record_of_channel(other), None, "{other}");
        }
    }
}
