//! [`RedisStore`]: store-core's [`IdempotencyStore`] on Redis.

use crate::checks::{ServerReport, check_server};
use crate::config::{RedisConfig, WaitConfig};
use crate::connection::Connection;
use crate::errors::store_error;
use crate::keys::RecordKeys;
use crate::record::{fingerprint_hex, record_from_fields, token_hex};
use crate::reply::{claim_outcome, fenced_outcome};
use crate::scripts::Scripts;
use async_trait::async_trait;
use redis::{Script, Value};
use std::collections::HashMap;
use store_core::{
    CallerId, ClaimOutcome, ClaimRequest, Fenced, HeldLease, IdempotencyKey, IdempotencyStore, Policy, PurgeReport,
    Record, RecoveryPoint, SavedResponse, StoreError, encode_response,
};

/// The Redis backend. Cheap to clone; clones share one connection.
#[derive(Clone)]
pub struct RedisStore {
    connection: Connection,
    scripts: Scripts,
    policy: Policy,
    key_prefix: String,
    wait: Option<WaitConfig>,
    accept_eviction: bool,
    report: ServerReport,
}

impl RedisStore {
    /// Validates the configuration, connects, and runs the startup checks
    /// ([`crate::checks`]): a server that may evict records is refused
    /// unless `accept_eviction` is set; missing persistence is a warning,
    /// logged and kept in [`RedisStore::server_report`].
    pub async fn connect(config: RedisConfig, policy: Policy) -> Result<Self, StoreError> {
        config
            .validate()
            .map_err(|error| StoreError::refused(format!("redis configuration: {error}"), error))?;
        let mut connection = Connection::open(&config)
            .await
            .map_err(|error| store_error("connect", error))?;
        let report = check_server(&mut connection, config.accept_eviction).await?;
        Ok(Self {
            connection,
            scripts: Scripts::new(),
            policy,
            key_prefix: config.key_prefix,
            wait: config.wait,
            accept_eviction: config.accept_eviction,
            report,
        })
    }

    /// What the startup checks found, warnings included.
    pub fn server_report(&self) -> &ServerReport {
        &self.report
    }

    /// Runs the startup checks again, e.g. after a failover or a
    /// configuration change; refuses as [`RedisStore::connect`] would.
    pub async fn check_server(&self) -> Result<ServerReport, StoreError> {
        check_server(&mut self.connection.clone(), self.accept_eviction).await
    }

    /// The Redis keys of one record, for operators (`redis-cli HGETALL`).
    pub fn keys(&self, caller: &CallerId, key: &IdempotencyKey) -> RecordKeys {
        RecordKeys::new(&self.key_prefix, caller, key)
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Runs one transition script on the record's two keys.
    async fn run(&self, name: &str, script: &Script, keys: &RecordKeys, args: &[&[u8]]) -> Result<Value, StoreError> {
        let mut invocation = script.key(&keys.record);
        invocation.key(&keys.tombstone);
        for arg in args {
            invocation.arg(*arg);
        }
        let mut connection = self.connection.clone();
        invocation
            .invoke_async(&mut connection)
            .await
            .map_err(|error| store_error(name, error))
    }

    /// With `WAIT` configured, waits until enough replicas have the write.
    /// Falling short is `Unavailable`: the write is on the primary but may
    /// be lost on failover, and sending the same call again is safe.
    async fn wait_for_replicas(&self, name: &str, keys: &RecordKeys) -> Result<(), StoreError> {
        let Some(wait) = self.wait else {
            return Ok(());
        };
        let mut command = redis::cmd("WAIT");
        command.arg(wait.replicas).arg(wait.timeout_ms);
        let reply = self
            .connection
            .clone()
            .query_at_key(&keys.record, &command)
            .await
            .map_err(|error| store_error("WAIT", error))?;
        let acknowledged = match reply {
            Value::Int(count) => u32::try_from(count).unwrap_or(0),
            _ => 0,
        };
        if acknowledged >= wait.replicas {
            return Ok(());
        }
        Err(StoreError::Unavailable {
            detail: format!(
                "redis {name}: applied on the primary but acknowledged by {acknowledged} of {} replicas within {} ms; it may be lost on failover",
                wait.replicas, wait.timeout_ms
            ),
            source: None,
        })
    }

    async fn fenced(
        &self,
        name: &str,
        script: &Script,
        lease: &HeldLease,
        args: &[&[u8]],
    ) -> Result<Fenced, StoreError> {
        let keys = self.keys(&lease.caller, &lease.key);
        let outcome = fenced_outcome(self.run(name, script, &keys, args).await?, name)?;
        if outcome.is_applied() {
            self.wait_for_replicas(name, &keys).await?;
        }
        Ok(outcome)
    }
}

#[async_trait]
impl IdempotencyStore for RedisStore {
    fn backend_name(&self) -> &'static str {
        "redis"
    }

    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let keys = self.keys(&request.caller, &request.key);
        let args = [
            fingerprint_hex(&request.fingerprint),
            token_hex(request.token),
            self.policy.lease_ms().to_string(),
            self.policy.retention_ms().to_string(),
            self.policy.tombstone_ms().to_string(),
        ];
        let args: Vec<&[u8]> = args.iter().map(|arg| arg.as_bytes()).collect();
        let reply = self.run("claim", &self.scripts.claim, &keys, &args).await?;
        let outcome = claim_outcome(reply, request)?;
        if matches!(outcome, ClaimOutcome::Acquired(_)) {
            self.wait_for_replicas("claim", &keys).await?;
        }
        Ok(outcome)
    }

    async fn checkpoint(&self, lease: &HeldLease, point: RecoveryPoint) -> Result<Fenced, StoreError> {
        let token = token_hex(lease.token);
        let args = [token.as_bytes(), point.as_bytes()];
        self.fenced("checkpoint", &self.scripts.checkpoint, lease, &args).await
    }

    async fn complete(&self, lease: &HeldLease, response: SavedResponse) -> Result<Fenced, StoreError> {
        let token = token_hex(lease.token);
        let retention_ms = self.policy.retention_ms().to_string();
        let tombstone_ms = self.policy.tombstone_ms().to_string();
        let encoded = encode_response(&response);
        let args = [
            token.as_bytes(),
            encoded.as_slice(),
            retention_ms.as_bytes(),
            tombstone_ms.as_bytes(),
        ];
        self.fenced("complete", &self.scripts.complete, lease, &args).await
    }

    async fn release(&self, lease: &HeldLease) -> Result<Fenced, StoreError> {
        let token = token_hex(lease.token);
        self.fenced("release", &self.scripts.release, lease, &[token.as_bytes()])
            .await
    }

    async fn abandon(&self, lease: &HeldLease) -> Result<Fenced, StoreError> {
        let token = token_hex(lease.token);
        self.fenced("abandon", &self.scripts.abandon, lease, &[token.as_bytes()])
            .await
    }

    /// Nothing to do: every record and tombstone carries a Redis TTL
    /// (`PEXPIREAT`, set by the scripts), and Redis deletes expired keys by
    /// itself. The report is always empty.
    async fn purge_expired(&self, _limit: usize) -> Result<PurgeReport, StoreError> {
        Ok(PurgeReport::default())
    }

    async fn inspect(&self, caller: &CallerId, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        let keys = self.keys(caller, key);
        let mut connection = self.connection.clone();
        let fields: HashMap<Vec<u8>, Vec<u8>> = redis::cmd("HGETALL")
            .arg(&keys.record)
            .query_async(&mut connection)
            .await
            .map_err(|error| store_error("inspect", error))?;
        if fields.is_empty() {
            return Ok(None);
        }
        let fields = fields
            .into_iter()
            .map(|(name, value)| (String::from_utf8_lossy(&name).into_owned(), value))
            .collect();
        record_from_fields(fields).map(Some)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let mut connection = self.connection.clone();
        redis::cmd("PING")
            .query_async::<String>(&mut connection)
            .await
            .map_err(|error| store_error("ping", error))?;
        Ok(())
    }
}
