//! [`RedisStore`]: store-core's [`IdempotencyStore`] on Redis.

use crate::batch::{
    BatchedScript, CLAIM_BATCH_QUEUED_ITEMS_MAX, CLAIM_BATCHES_IN_FLIGHT_MAX, ClaimBatchRunner, ClaimBatcher,
    ScriptItem,
};
use crate::checks::{ServerReport, check_server};
use crate::config::{RedisConfig, WaitConfig};
use crate::connection::Connection;
use crate::errors::store_error;
use crate::keys::RecordKeys;
use crate::notify::{ChangeSubscriber, publish_mode};
use crate::record::{fingerprint_hex, record_from_fields, token_hex};
use crate::reply::{ForgetReply, claim_outcome, fenced_outcome, forget_reply};
use crate::scripts::Scripts;
use crate::tls::{handshake_failure, handshake_refusal, tls_certificates};
use async_trait::async_trait;
use redis::{Script, Value};
use std::collections::HashMap;
use std::sync::Arc;
use store_core::{
    BatchError, BatchLimits, Batcher, CallerId, ChangeHub, ClaimOutcome, ClaimRequest, Fenced, ForgetOutcome,
    HeldLease, IdempotencyKey, IdempotencyStore, KeyDigest, Policy, PurgeReport, Record, RecordId, RecoveryPoint,
    SavedResponse, StoreError, encode_response,
};

/// Reads of a record that forget makes at most, when each time the record
/// changed between the read and the delete (a claim wrote it meanwhile).
pub const FORGET_READS_MAX: u32 = 3;

/// First argument of the forget script: the record is not a hash.
const FORGET_NOT_A_HASH: &[u8] = b"not_a_hash";
/// First argument of the forget script: the hash's fields follow.
const FORGET_HASH: &[u8] = b"hash";

/// A record's hash as `HGETALL` returns it.
type RawFields = HashMap<Vec<u8>, Vec<u8>>;

/// What forget found when it read a record.
enum Judged {
    Absent,
    Readable,
    /// In a format newer than this build reads: a newer build's, kept.
    NewerFormat,
    /// The forget script's arguments that describe the unreadable record.
    Unreadable(Vec<Vec<u8>>),
}

/// Decodes a record's hash exactly as every call does.
fn record_of_hash(fields: RawFields) -> Result<Record, StoreError> {
    let fields = fields
        .into_iter()
        .map(|(name, value)| (String::from_utf8_lossy(&name).into_owned(), value))
        .collect();
    record_from_fields(fields)
}

/// The Redis backend. Cheap to clone; clones share one connection.
#[derive(Clone)]
pub struct RedisStore {
    pub(crate) connection: Connection,
    scripts: Scripts,
    pub(crate) policy: Policy,
    key_prefix: String,
    wait: Option<WaitConfig>,
    accept_eviction: bool,
    report: ServerReport,
    /// Waiters on this instance, woken by its subscriber (`notify.rs`).
    changes: ChangeHub,
    /// How the scripts publish a change: sharded on Cluster.
    publish_mode: &'static str,
    /// Claims pipelined across calls (`batch.rs`): on a standalone server
    /// with `batch_items_max` above 1.
    claims: Option<ClaimBatcher>,
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
        let certificates = tls_certificates(&config)?;
        let mut connection =
            Connection::open(&config, certificates.clone())
                .await
                .map_err(|error| match handshake_failure(&error) {
                    Some(cause) if config.uses_tls() => handshake_refusal(&config, &cause),
                    _ => store_error("connect", error),
                })?;
        let report = check_server(&mut connection, config.accept_eviction).await?;
        let publish_mode = publish_mode(config.cluster);
        let scripts = Scripts::new();
        let claims = claim_batcher(&config, &connection, &scripts)?;
        let changes = ChangeHub::with_source(Arc::new(ChangeSubscriber::new(config.clone(), certificates)));
        Ok(Self {
            connection,
            scripts,
            policy,
            key_prefix: config.key_prefix,
            wait: config.wait,
            accept_eviction: config.accept_eviction,
            report,
            changes,
            publish_mode,
            claims,
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

    /// The claim script's arguments.
    pub(crate) fn claim_args(&self, request: &ClaimRequest) -> Vec<Vec<u8>> {
        let args = [
            fingerprint_hex(&request.fingerprint),
            token_hex(request.token),
            self.policy.lease_ms().to_string(),
            self.policy.retention_ms().to_string(),
            self.policy.tombstone_ms().to_string(),
        ];
        args.into_iter().map(String::into_bytes).collect()
    }

    /// The claim's outcome from its script's reply, once enough replicas
    /// have an acquired claim's record (with `WAIT` configured).
    pub(crate) async fn claim_from_reply(
        &self,
        request: &ClaimRequest,
        keys: &RecordKeys,
        reply: Value,
    ) -> Result<ClaimOutcome, StoreError> {
        let outcome = claim_outcome(reply, request)?;
        if matches!(outcome, ClaimOutcome::Acquired(_)) {
            self.wait_for_replicas("claim", keys).await?;
        }
        Ok(outcome)
    }

    /// Runs `requests` as one claim pipeline, as if they had all arrived
    /// while the previous one was in flight, then finishes each in order as
    /// `claim` does. For the tests (`testkit::claim_in_one_pipeline`).
    #[cfg(feature = "testkit")]
    pub(crate) async fn claim_in_one_pipeline(
        &self,
        requests: &[ClaimRequest],
    ) -> Vec<(&'static str, Result<ClaimOutcome, StoreError>)> {
        use store_core::BatchRunner;
        let runner = ClaimBatchRunner {
            connection: self.connection.clone(),
            script: self.scripts.claim.clone(),
        };
        let items = requests
            .iter()
            .map(|request| ScriptItem {
                keys: self.keys(&request.caller, &request.key),
                args: self.claim_args(request),
            })
            .collect();
        let batched = runner.run(items).await;
        assert_eq!(batched.len(), requests.len(), "one reply per claim");
        let mut outcomes = Vec::new();
        for (request, batched) in requests.iter().zip(batched) {
            let keys = self.keys(&request.caller, &request.key);
            let kind = batched.kind();
            let reply = match batched {
                BatchedScript::Reply(reply) => Ok(reply),
                BatchedScript::Unavailable(detail) => Err(StoreError::Unavailable { detail, source: None }),
                BatchedScript::Alone => self.claim_reply_alone(&keys, self.claim_args(request)).await,
            };
            let outcome = match reply {
                Ok(reply) => self.claim_from_reply(request, &keys, reply).await,
                Err(error) => Err(error),
            };
            outcomes.push((kind, outcome));
        }
        outcomes
    }

    async fn claim_reply_alone(&self, keys: &RecordKeys, args: Vec<Vec<u8>>) -> Result<Value, StoreError> {
        let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        self.run("claim", &self.scripts.claim, keys, &args).await
    }

    /// The claim script's reply: from a pipeline with the claims that
    /// arrive while the previous one is in flight, or on its own when the
    /// pipeline gave none (or without batching).
    pub(crate) async fn claim_reply(&self, keys: &RecordKeys, args: Vec<Vec<u8>>) -> Result<Value, StoreError> {
        if let Some(claims) = &self.claims {
            let item = ScriptItem {
                keys: keys.clone(),
                args: args.clone(),
            };
            match claims.submit(item).await {
                Ok(BatchedScript::Reply(reply)) => return Ok(reply),
                Ok(BatchedScript::Unavailable(detail)) => return Err(StoreError::Unavailable { detail, source: None }),
                Ok(BatchedScript::Alone) | Err(BatchError::Lost) => {}
                Err(refused @ BatchError::QueueFull { .. }) => {
                    return Err(StoreError::unavailable(
                        "redis claims are queued past their bound",
                        refused,
                    ));
                }
            }
        }
        self.claim_reply_alone(keys, args).await
    }

    /// With `WAIT` configured, waits until enough replicas have the write.
    /// Falling short is `Unavailable`: the write is on the primary but may
    /// be lost on failover, and sending the same call again is safe.
    pub(crate) async fn wait_for_replicas(&self, name: &str, keys: &RecordKeys) -> Result<(), StoreError> {
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

    /// Reads the record and judges it with the decoder every call uses.
    async fn judge_for_forget(&self, keys: &RecordKeys) -> Result<Judged, StoreError> {
        let mut connection = self.connection.clone();
        let read: Result<RawFields, redis::RedisError> = redis::cmd("HGETALL")
            .arg(&keys.record)
            .query_async(&mut connection)
            .await;
        let fields = match read {
            Err(error) if error.code() == Some("WRONGTYPE") => {
                return Ok(Judged::Unreadable(vec![FORGET_NOT_A_HASH.to_vec()]));
            }
            Err(error) => return Err(store_error("forget", error)),
            Ok(fields) if fields.is_empty() => return Ok(Judged::Absent),
            Ok(fields) => fields,
        };
        match record_of_hash(fields.clone()) {
            Ok(_) => Ok(Judged::Readable),
            Err(StoreError::Corrupt(codec)) if codec.is_newer_format() => Ok(Judged::NewerFormat),
            Err(StoreError::Corrupt(_)) => {
                let mut args = vec![FORGET_HASH.to_vec()];
                for (name, value) in fields {
                    args.extend([name, value]);
                }
                Ok(Judged::Unreadable(args))
            }
            Err(other) => Err(other),
        }
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

    /// A fenced write that ends a started state: the script also publishes
    /// on the record's channel, and this instance's own waiters are woken at
    /// once (docs/design.md#waiting). Only a lost lease certainly wrote
    /// nothing.
    async fn ending(
        &self,
        name: &str,
        script: &Script,
        lease: &HeldLease,
        args: &[&[u8]],
    ) -> Result<Fenced, StoreError> {
        let channel = self.keys(&lease.caller, &lease.key).changes;
        let mut args = args.to_vec();
        args.push(self.publish_mode.as_bytes());
        args.push(channel.as_bytes());
        let result = self.fenced(name, script, lease, &args).await;
        if !matches!(result, Ok(Fenced::LeaseLost)) {
            self.changes.notify(&RecordId::new(&lease.caller, &lease.key));
        }
        result
    }
}

/// The claim batcher of a standalone server with batching on.
fn claim_batcher(
    config: &RedisConfig,
    connection: &Connection,
    scripts: &Scripts,
) -> Result<Option<ClaimBatcher>, StoreError> {
    if config.cluster || config.batch_items_max == 1 {
        return Ok(None);
    }
    let limits = BatchLimits::new(
        config.batch_items_max,
        CLAIM_BATCH_QUEUED_ITEMS_MAX,
        CLAIM_BATCHES_IN_FLIGHT_MAX,
    )
    .map_err(|error| StoreError::refused("redis configuration: batch_items_max", error))?;
    let runner = ClaimBatchRunner {
        connection: connection.clone(),
        script: scripts.claim.clone(),
    };
    Ok(Some(Batcher::new(runner, limits)))
}

#[async_trait]
impl IdempotencyStore for RedisStore {
    fn backend_name(&self) -> &'static str {
        "redis"
    }

    /// Pipelined with the claims that arrive while the previous pipeline
    /// is in flight, on a standalone server (`batch.rs`).
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let keys = self.keys(&request.caller, &request.key);
        let reply = self.claim_reply(&keys, self.claim_args(request)).await?;
        self.claim_from_reply(request, &keys, reply).await
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
        self.ending("complete", &self.scripts.complete, lease, &args).await
    }

    async fn release(&self, lease: &HeldLease) -> Result<Fenced, StoreError> {
        let token = token_hex(lease.token);
        self.ending("release", &self.scripts.release, lease, &[token.as_bytes()])
            .await
    }

    async fn abandon(&self, lease: &HeldLease) -> Result<Fenced, StoreError> {
        let token = token_hex(lease.token);
        self.ending("abandon", &self.scripts.abandon, lease, &[token.as_bytes()])
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
        record_of_hash(fields).map(Some)
    }

    /// Reads the record and judges it in Rust (the response's postcard
    /// bytes are beyond Lua), then runs `scripts/forget.lua`, which deletes
    /// it only if it is still byte for byte what was judged unreadable, or
    /// any key of another type than a hash. A record written in between is
    /// read and judged again, up to [`FORGET_READS_MAX`] times.
    async fn forget_unreadable_record(&self, caller: &CallerId, key: KeyDigest) -> Result<ForgetOutcome, StoreError> {
        let keys = RecordKeys::of_digest(&self.key_prefix, caller, key);
        for _ in 0..FORGET_READS_MAX {
            let args = match self.judge_for_forget(&keys).await? {
                Judged::Absent => return Ok(ForgetOutcome::NotFound),
                Judged::Readable => return Ok(ForgetOutcome::Readable),
                Judged::NewerFormat => return Ok(ForgetOutcome::NewerFormat),
                Judged::Unreadable(args) => args,
            };
            let mut invocation = self.scripts.forget.key(&keys.record);
            for arg in &args {
                invocation.arg(arg.as_slice());
            }
            let mut connection = self.connection.clone();
            let reply = invocation
                .invoke_async(&mut connection)
                .await
                .map_err(|error| store_error("forget", error))?;
            match forget_reply(reply)? {
                ForgetReply::Deleted => {
                    tracing::warn!(%caller, key_sha256 = %key, "deleted an unreadable record: its key may be claimed again");
                    self.wait_for_replicas("forget", &keys).await?;
                    return Ok(ForgetOutcome::Deleted);
                }
                ForgetReply::NotFound => return Ok(ForgetOutcome::NotFound),
                ForgetReply::Changed => continue,
            }
        }
        Err(StoreError::RetriesExhausted {
            attempts: FORGET_READS_MAX,
            detail: "the record changed between every read and delete; nothing was deleted".to_owned(),
        })
    }

    fn record_changes(&self) -> Option<&ChangeHub> {
        Some(&self.changes)
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
