//! One server (or cluster) shared by the tests of a binary that run at the
//! same time, and a store that keeps its server alive.
//!
//! A process-wide static would never be dropped, so its redis-server would
//! outlive the test binary. Here the statics hold only weak references: the
//! tests hold the strong ones (through [`StoreWithServer`]), and when the last
//! test using a server ends, the server is killed; a later test starts a new one.

use super::{ClientAuth, HarnessError, RedisCluster, RedisServer, TlsSetup};
use crate::RedisStore;
use crate::config::RedisConfig;
use async_trait::async_trait;
use std::sync::{Arc, Mutex, Weak};
use store_core::testkit::SharedStore;
use store_core::{
    CallerId, ClaimOutcome, ClaimRequest, Fenced, ForgetOutcome, HeldLease, IdempotencyKey, IdempotencyStore,
    KeyDigest, Policy, PurgeReport, Record, RecoveryPoint, SavedResponse, StoreError,
};

static SHARED_SERVER: Mutex<Weak<RedisServer>> = Mutex::new(Weak::new());
static SHARED_CLUSTER: Mutex<Weak<RedisCluster>> = Mutex::new(Weak::new());
static SHARED_TLS_SERVER: Mutex<Weak<RedisServer>> = Mutex::new(Weak::new());
static SHARED_TLS_CLUSTER: Mutex<Weak<RedisCluster>> = Mutex::new(Weak::new());

/// The standalone server the running tests share, started if none runs.
pub fn shared_server() -> Result<Arc<RedisServer>, HarnessError> {
    shared(&SHARED_SERVER, RedisServer::start)
}

/// The cluster the running tests share, started if none runs.
pub fn shared_cluster() -> Result<Arc<RedisCluster>, HarnessError> {
    shared(&SHARED_CLUSTER, RedisCluster::start)
}

/// A shared standalone server that speaks TLS only and requires a client
/// certificate (mutual TLS), started if none runs.
pub fn shared_tls_server() -> Result<Arc<RedisServer>, HarnessError> {
    shared(&SHARED_TLS_SERVER, || {
        RedisServer::start_tls(TlsSetup::generate(ClientAuth::Required)?)
    })
}

/// A shared cluster that speaks TLS only (clients and cluster bus), started if none runs.
pub fn shared_tls_cluster() -> Result<Arc<RedisCluster>, HarnessError> {
    shared(&SHARED_TLS_CLUSTER, || {
        RedisCluster::start_tls(TlsSetup::generate(ClientAuth::Optional)?)
    })
}

fn shared<T>(slot: &Mutex<Weak<T>>, start: fn() -> Result<T, HarnessError>) -> Result<Arc<T>, HarnessError> {
    // A test that panicked while holding the lock left only a Weak behind,
    // which is still sound to use.
    let mut weak = slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(running) = weak.upgrade() {
        return Ok(running);
    }
    let started = Arc::new(start()?);
    *weak = Arc::downgrade(&started);
    Ok(started)
}

/// Two instances of the store over one shared server or cluster, each with
/// its own connections and its own subscriber: what store-core's waiting
/// suite runs on.
pub async fn two_instances<S: Send + Sync + 'static>(
    server: Arc<S>,
    config: RedisConfig,
    policy: Policy,
) -> (SharedStore, SharedStore) {
    let first = RedisStore::connect(config.clone(), policy).await.expect("first store");
    let second = RedisStore::connect(config, policy).await.expect("second store");
    (
        Arc::new(StoreWithServer::new(first, server.clone())),
        Arc::new(StoreWithServer::new(second, server)),
    )
}

/// A [`RedisStore`] that keeps the server (or cluster) it talks to alive.
pub struct StoreWithServer<S> {
    store: RedisStore,
    _server: Arc<S>,
}

impl<S> StoreWithServer<S> {
    pub fn new(store: RedisStore, server: Arc<S>) -> Self {
        Self { store, _server: server }
    }

    pub fn store(&self) -> &RedisStore {
        &self.store
    }
}

#[async_trait]
impl<S: Send + Sync> IdempotencyStore for StoreWithServer<S> {
    fn backend_name(&self) -> &'static str {
        self.store.backend_name()
    }

    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.store.claim(request).await
    }

    async fn checkpoint(&self, lease: &HeldLease, point: RecoveryPoint) -> Result<Fenced, StoreError> {
        self.store.checkpoint(lease, point).await
    }

    async fn complete(&self, lease: &HeldLease, response: SavedResponse) -> Result<Fenced, StoreError> {
        self.store.complete(lease, response).await
    }

    async fn release(&self, lease: &HeldLease) -> Result<Fenced, StoreError> {
        self.store.release(lease).await
    }

    async fn abandon(&self, lease: &HeldLease) -> Result<Fenced, StoreError> {
        self.store.abandon(lease).await
    }

    async fn purge_expired(&self, limit: usize) -> Result<PurgeReport, StoreError> {
        self.store.purge_expired(limit).await
    }

    async fn inspect(&self, caller: &CallerId, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        self.store.inspect(caller, key).await
    }

    async fn forget_unreadable_record(&self, caller: &CallerId, key: KeyDigest) -> Result<ForgetOutcome, StoreError> {
        self.store.forget_unreadable_record(caller, key).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.store.ping().await
    }

    fn record_changes(&self) -> Option<&store_core::ChangeHub> {
        self.store.record_changes()
    }
}
