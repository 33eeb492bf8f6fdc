//! The Redis backend, on a redis-server spawned by store-redis's harness (or
//! one given by URL), and its baselines: the same two Lua scripts (claim,
//! complete) called raw over one multiplexed connection, and
//! `redis-benchmark` calling the claim script.
//!
//! Redis keeps only the key record: the label (the effect) cannot commit in
//! the same transaction, so a Redis intent is claim plus complete.

use super::{
    Baseline, IntentInputs, KeepAlive, ReferenceRate, References, ServerAddress, StoreTarget, TargetError,
    claim_not_acquired, completion, store_error,
};
use crate::cli::{BackendArgs, RedisPersistence};
use crate::engine::Workload;
use crate::intent::RunIds;
use crate::recorder::Outcome;
use futures::future::BoxFuture;
use redis::aio::MultiplexedConnection;
use std::process::Command;
use std::sync::Arc;
use store_core::{ClaimOutcome, IdempotencyStore, LeaseToken, Policy};
use store_redis::scripts::Scripts;
use store_redis::testkit::RedisServer;
use store_redis::{RedisConfig, RedisStore};
use store_registry::{OpenedStore, StoreConfig, StoreKind};

/// The reference tool, from Debian's redis-tools.
pub const REDIS_BENCHMARK_PROGRAM: &str = "redis-benchmark";
/// Requests redis-benchmark sends per second of the saturation duration: at
/// the tens of thousands of calls per second a 2-core machine manages, a
/// run takes about as long as the saturation phase.
const REDIS_BENCHMARK_REQUESTS_PER_S: u64 = 30_000;
/// Key prefix of the raw baseline, apart from the store's keys.
const RAW_PREFIX: &str = "bench-raw:";

/// The spawned server's arguments for a persistence setting.
pub fn persistence_args(persistence: RedisPersistence) -> Vec<&'static str> {
    match persistence {
        RedisPersistence::None => vec![],
        RedisPersistence::Everysec => vec!["--appendonly", "yes", "--appendfsync", "everysec"],
        RedisPersistence::Always => vec!["--appendonly", "yes", "--appendfsync", "always"],
    }
}

fn persistence_note(persistence: RedisPersistence) -> &'static str {
    match persistence {
        RedisPersistence::None => "no persistence",
        RedisPersistence::Everysec => "AOF, appendfsync everysec",
        RedisPersistence::Always => "AOF, appendfsync always",
    }
}

/// A server URL for `args`: the one given, or a freshly spawned server and
/// the guard that keeps it alive.
pub fn server_for(args: &BackendArgs) -> Result<ServerAddress, TargetError> {
    if let Some(url) = &args.redis_url {
        return Ok(ServerAddress {
            url: url.clone(),
            guard: None,
            note: "given by --redis-url".into(),
        });
    }
    let server = RedisServer::start_with_args(&persistence_args(args.redis_persistence))
        .map_err(|error| TargetError::unavailable("redis", error))?;
    let note = format!("spawned redis-server, {}", persistence_note(args.redis_persistence));
    Ok(ServerAddress {
        url: server.url(),
        guard: Some(Box::new(server)),
        note,
    })
}

pub async fn open(args: &BackendArgs, policy: Policy) -> Result<StoreTarget, TargetError> {
    let ServerAddress { url, guard, note } = server_for(args)?;
    let store_config = StoreConfig {
        kind: StoreKind::Redis,
        redis: RedisConfig::standalone(url.clone()),
        ..StoreConfig::default()
    };
    let OpenedStore::Redis(store) = super::open_store(&store_config, policy).await? else {
        return Err(super::other_kind(StoreKind::Redis));
    };
    let raw_connection = redis::Client::open(url.as_str())
        .map_err(|error| TargetError::unavailable("redis", error))?
        .get_multiplexed_async_connection()
        .await
        .map_err(|error| TargetError::unavailable("redis", error))?;
    let raw = RawScripts::new(raw_connection, &policy);
    let references = RedisBenchmark {
        url: url.clone(),
        claim_args: raw.claim_args.as_ref().clone(),
    };
    let mut keep_alive: Vec<KeepAlive> = vec![Box::new(store.clone())];
    keep_alive.extend(guard);
    Ok(StoreTarget {
        backend: "redis".into(),
        notes: vec![format!("{url}: {note}"), "intent = claim + complete (no effect row: Redis cannot commit the label with the key)".into()],
        intents: Arc::new(RedisIntents {
            store,
            inputs: Arc::new(IntentInputs::new("redis")?),
        }),
        baseline: Some(Baseline {
            name: "raw claim+complete scripts".into(),
            description: "the store's claim and complete Lua scripts by EVALSHA on fresh keys with precomputed arguments, over one multiplexed connection".into(),
            workload: Arc::new(raw),
        }),
        references: Some(Box::new(references)),
        keep_alive,
    })
}

struct RedisIntents {
    store: Arc<RedisStore>,
    inputs: Arc<IntentInputs>,
}

impl Workload for RedisIntents {
    fn operation(&self, index: u64) -> BoxFuture<'static, Outcome> {
        let store = self.store.clone();
        let inputs = self.inputs.clone();
        Box::pin(async move { run_intent(&store, &inputs, index).await })
    }
}

async fn run_intent(store: &RedisStore, inputs: &IntentInputs, index: u64) -> Outcome {
    let request = match inputs.claim(index) {
        Ok((_, request)) => request,
        Err(outcome) => return outcome,
    };
    let lease = match store.claim(&request).await {
        Ok(ClaimOutcome::Acquired(acquired)) => acquired.lease,
        Ok(other) => return claim_not_acquired(&other),
        Err(error) => return store_error(&error),
    };
    completion(store.complete(&lease, inputs.response.clone()).await)
}

/// The two scripts without the store: arguments made once, keys from the
/// operation number, replies not decoded.
struct RawScripts {
    connection: MultiplexedConnection,
    scripts: Arc<Scripts>,
    claim_args: Arc<Vec<String>>,
    complete_tail: Arc<Vec<Vec<u8>>>,
}

impl RawScripts {
    fn new(connection: MultiplexedConnection, policy: &Policy) -> Self {
        let intent = RunIds::with_base(1).intent(0);
        let token = LeaseToken::random().to_string();
        let response_bytes = intent
            .saved_response()
            .map(|response| response.body().len())
            .unwrap_or(300);
        Self {
            connection,
            scripts: Arc::new(Scripts::new()),
            claim_args: Arc::new(vec![
                intent.fingerprint().to_string(),
                token.clone(),
                policy.lease_ms().to_string(),
                policy.retention_ms().to_string(),
                policy.tombstone_ms().to_string(),
            ]),
            complete_tail: Arc::new(vec![
                token.into_bytes(),
                vec![b'r'; response_bytes + 40],
                policy.retention_ms().to_string().into_bytes(),
                policy.tombstone_ms().to_string().into_bytes(),
            ]),
        }
    }
}

impl Workload for RawScripts {
    fn operation(&self, index: u64) -> BoxFuture<'static, Outcome> {
        let mut connection = self.connection.clone();
        let scripts = self.scripts.clone();
        let claim_args = self.claim_args.clone();
        let complete_args = self.complete_tail.clone();
        Box::pin(async move {
            let record = format!("{RAW_PREFIX}{{{index}}}:rec");
            let tombstone = format!("{RAW_PREFIX}{{{index}}}:tomb");
            let mut claim = scripts.claim.key(&record);
            claim.key(&tombstone);
            for arg in claim_args.iter() {
                claim.arg(arg);
            }
            if claim.invoke_async::<redis::Value>(&mut connection).await.is_err() {
                return Outcome::failure("raw_claim_error");
            }
            let mut complete = scripts.complete.key(&record);
            complete.key(&tombstone);
            for arg in complete_args.iter() {
                complete.arg(arg.as_slice());
            }
            match complete.invoke_async::<redis::Value>(&mut connection).await {
                Ok(_) => Outcome::success("raw_pair"),
                Err(_) => Outcome::failure("raw_complete_error"),
            }
        })
    }
}

/// `redis-benchmark` calling the claim script on random fresh keys.
struct RedisBenchmark {
    url: String,
    claim_args: Vec<String>,
}

impl References for RedisBenchmark {
    fn measure(&self, duration_s: u64, concurrency: usize) -> Vec<ReferenceRate> {
        match self.run(duration_s, concurrency) {
            Ok(reference) => vec![reference],
            Err(error) => {
                eprintln!("redis-benchmark reference skipped: {error}");
                Vec::new()
            }
        }
    }
}

impl RedisBenchmark {
    fn run(&self, duration_s: u64, concurrency: usize) -> Result<ReferenceRate, String> {
        let (host, port) =
            host_port(&self.url).ok_or_else(|| format!("cannot read host and port from {}", self.url))?;
        let client = redis::Client::open(self.url.as_str()).map_err(|error| error.to_string())?;
        let mut connection = client.get_connection().map_err(|error| error.to_string())?;
        let sha = Scripts::new()
            .claim
            .load(&mut connection)
            .map_err(|error| error.to_string())?;
        let requests = (REDIS_BENCHMARK_REQUESTS_PER_S * duration_s).to_string();
        let clients = concurrency.to_string();
        let mut arguments: Vec<String> = [
            "-h",
            &host,
            "-p",
            &port,
            "-c",
            &clients,
            "-n",
            &requests,
            "-r",
            "1000000000",
            "--csv",
        ]
        .iter()
        .map(|arg| (*arg).to_owned())
        .collect();
        arguments.extend(["EVALSHA".into(), sha, "2".into()]);
        arguments.extend([
            "bench-rb:{__rand_int__}:rec".into(),
            "bench-rb:{__rand_int__}:tomb".into(),
        ]);
        arguments.extend(self.claim_args.iter().cloned());
        let output = Command::new(REDIS_BENCHMARK_PROGRAM)
            .args(&arguments)
            .output()
            .map_err(|error| format!("{REDIS_BENCHMARK_PROGRAM}: {error}"))?;
        let text = String::from_utf8_lossy(&output.stdout);
        let calls_per_s = parse_csv_rate(&text).ok_or_else(|| format!("unexpected output: {text}"))?;
        Ok(ReferenceRate {
            name: "redis-benchmark claim script".into(),
            command: format!("{REDIS_BENCHMARK_PROGRAM} {}", arguments.join(" ")),
            calls_per_s,
            pairs_per_s: calls_per_s / 2.0,
        })
    }
}

fn host_port(url: &str) -> Option<(String, String)> {
    let rest = url.strip_prefix("redis://")?;
    let address = rest.rsplit('@').next()?.split('/').next()?;
    let (host, port) = address.rsplit_once(':')?;
    Some((host.to_owned(), port.to_owned()))
}

/// The rate in `redis-benchmark --csv` output: the second field of the
/// first line after the header.
pub fn parse_csv_rate(text: &str) -> Option<f64> {
    let line = text
        .lines()
        .find(|line| !line.starts_with("\"test\"") && line.contains(','))?;
    line.split(',').nth(1)?.trim_matches('"').parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_benchmark_csv_is_read() {
        let text = "\"test\",\"rps\",\"avg_latency_ms\"\n\"EVALSHA abc\",\"41152.26\",\"1.1\"\n";
        assert_eq!(parse_csv_rate(text), Some(41_152.26));
        assert_eq!(parse_csv_rate("garbage"), None);
        assert_eq!(
            host_port("redis://127.0.0.1:6390"),
            Some(("127.0.0.1".into(), "6390".into()))
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_intent_and_a_raw_pair_run_against_a_real_server() {
        let args = BackendArgs {
            embedded_durability: crate::cli::DurabilityArg::Buffer,
            embedded_dir: None,
            redis_url: None,
            redis_persistence: RedisPersistence::None,
            postgres_url: None,
            foundationdb_cluster_file: None,
            foundationdb_key_prefix: None,
            claim_batch_items_max: None,
        };
        let target = open(&args, Policy::default()).await.unwrap();
        assert_eq!(target.intents.operation(0).await, Outcome::success("first_run"));
        assert_eq!(target.intents.operation(0).await, Outcome::failure("unexpected_replay"));
        let baseline = target.baseline.as_ref().unwrap();
        assert_eq!(baseline.workload.operation(0).await, Outcome::success("raw_pair"));
        assert_eq!(baseline.workload.operation(1).await, Outcome::success("raw_pair"));
    }
}
