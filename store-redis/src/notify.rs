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
//! its first local waiter and unsubscribes when the last one leaves, in the
//! order the hub asked, so a quick leave-and-return never ends unsubscribed.
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
use std::sync::{Mutex, PoisonError};
use store_core::{ChangeNotifier, ChangeSource, RecordId, WatchGuard, reconnect_delay};
use tokio::sync::mpsc;
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

/// A subscription the hub asked for, in order.
enum Subscription {
    Start(String),
    Stop(String),
}

/// The subscriber of one store instance.
pub(crate) struct ChangeSubscriber {
    config: RedisConfig,
    /// The store's own, so the subscriber connects over TLS as it does.
    certificates: Option<TlsCertificates>,
    prefix: String,
    running: Mutex<Option<(mpsc::UnboundedSender<Subscription>, JoinHandle<()>)>>,
}

impl ChangeSubscriber {
    pub(crate) fn new(config: RedisConfig, certificates: Option<TlsCertificates>) -> Self {
        Self {
            prefix: config.key_prefix.clone(),
            config,
            certificates,
            running: Mutex::new(None),
        }
    }

    /// The task's inbox, starting the task if it is not running; `None`
    /// outside a runtime (the waiters then poll).
    fn inbox(&self, notifier: &ChangeNotifier) -> Option<mpsc::UnboundedSender<Subscription>> {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((inbox, task)) = running.as_ref()
            && !task.is_finished()
        {
            return Some(inbox.clone());
        }
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let (inbox, requests) = mpsc::unbounded_channel();
        let task = runtime.spawn(subscribe_while_alive(
            self.config.clone(),
            self.certificates.clone(),
            requests,
            notifier.clone(),
        ));
        *running = Some((inbox.clone(), task));
        Some(inbox)
    }
}

impl ChangeSource for ChangeSubscriber {
    fn watch_record(&self, record: &RecordId, notifier: ChangeNotifier) -> WatchGuard {
        let channel = format!("{}{{{}}}{CHANGE_CHANNEL_SUFFIX}", self.prefix, record.tag());
        let Some(inbox) = self.inbox(&notifier) else {
            return WatchGuard::none();
        };
        // A send fails only once the task has ended; the waiters then poll.
        let _ = inbox.send(Subscription::Start(channel.clone()));
        WatchGuard::on_drop(move || {
            let _ = inbox.send(Subscription::Stop(channel));
        })
    }
}

impl Drop for ChangeSubscriber {
    fn drop(&mut self) {
        let running = self.running.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, task)) = running.take() {
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

/// Opens the subscriber (again after each failure to open it), then serves
/// the hub's requests and hands on the pushes until the store is gone.
async fn subscribe_while_alive(
    config: RedisConfig,
    certificates: Option<TlsCertificates>,
    mut requests: mpsc::UnboundedReceiver<Subscription>,
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
        tokio::select! {
            request = requests.recv() => {
                let Some(request) = request else { return };
                serve(&mut subscriber, request, &notifier).await;
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

async fn serve(subscriber: &mut Subscriber, request: Subscription, notifier: &ChangeNotifier) {
    match request {
        Subscription::Start(channel) => match subscriber.start(&channel).await {
            // Subscribed: a change published before now is read now.
            Ok(()) => {
                if let Some(record) = record_of_channel(&channel) {
                    notifier.notify(&record);
                }
            }
            Err(error) => tracing::warn!(%error, "redis change subscription failed; its waiters poll"),
        },
        Subscription::Stop(channel) => {
            if let Err(error) = subscriber.stop(&channel).await {
                tracing::debug!(%error, "redis change unsubscription failed");
            }
        }
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
