//! The command line of http mode.

use super::connection_pool::PoolOrder;
use crate::cli::{BackendArgs, LoadArgs, OutputArgs};
use clap::{Args, ValueEnum};
use std::path::PathBuf;
use store_registry::StoreKind;

/// The Fulfilment service's deadline per call (250 ms: docs/design.md#client-deadline).
pub const DEADLINE_MS_DEFAULT: u64 = 250;
/// Attempts per intent before the client gives up (the intent is then lost).
pub const ATTEMPTS_MAX_DEFAULT: u32 = 10;
/// Requests the client has on the wire at once, over all instances: the
/// connection pool of a Fulfilment service, as HTTP clients bound it (the
/// AWS SDKs' `maxConnections`, OkHttp's `maxRequests`). Without a bound, an
/// overloaded server meets one new connection per queued intent, and the
/// client's own pool scans its waiters on every return (hyper-util's
/// `clean_waiters`): BENCHMARKS.md, "2,000/s on an AMD EPYC machine".
pub const CONNECTIONS_MAX_DEFAULT: usize = 256;
/// Most `--connections-max` accepted.
pub const CONNECTIONS_MAX_LIMIT: usize = 10_000;
/// First backoff after a retryable answer.
pub const BACKOFF_MS_BASE_DEFAULT: u64 = 20;
/// Longest backoff between two attempts.
pub const BACKOFF_MS_CAP_DEFAULT: u64 = 1_000;
/// Share of intents sent twice at once (a reply lost on the way back, as
/// the client would see it).
pub const DUPLICATE_SHARE_DEFAULT: f64 = 0.01;
/// Share of carrier purchases whose reply the simulator drops.
pub const CARRIER_LOST_REPLY_RATE_DEFAULT: f64 = 0.001;
/// Simulated carrier latency of a spawned simulator. The server's own
/// default (20 to 80 ms) models a real carrier; the bench defaults to a fast
/// carrier so the numbers show the Label service and its store, which is
/// what the 10 ms p99 target is about.
pub const CARRIER_LATENCY_MS_MIN_DEFAULT: u64 = 0;
pub const CARRIER_LATENCY_MS_MAX_DEFAULT: u64 = 2;
/// The development caller's token (the server's default config).
pub const TOKEN_DEFAULT: &str = "demo-token";
/// Longest `--prefer-wait` accepted, in seconds: the Label service grants
/// at most 300 (idem-http's `WAIT_CAP_S_MAX`), so a longer one would only
/// stretch the client's deadline.
pub const PREFER_WAIT_S_MAX: u64 = 300;

/// How the Fulfilment client retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClientProfile {
    /// The design's client and the default (idem-client's default,
    /// docs/design.md "retries must not multiply an outage"), as mature
    /// clients retry: waits at least the server's `Retry-After`, full
    /// jitter, and a retry budget shared by the whole client (a fifth of
    /// the intents of the last ten seconds, Finagle's retry budget), so an
    /// overloaded server sees a fifth more requests at most, not a multiple.
    /// When the budget is empty the intent gives up and counts as lost.
    Standard,
    /// As standard, but when the quota is empty a retry waits the longest
    /// backoff more and goes ahead unpaid, as a service that puts the
    /// intent back on its queue would: retries slow down but never stop.
    Polite,
    /// Retries every retryable answer after its jittered backoff alone,
    /// ignoring `Retry-After`, with no quota: a retry storm, for load
    /// testers who want to see one.
    Aggressive,
}

impl std::fmt::Display for ClientProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ClientProfile::Polite => "polite",
            ClientProfile::Standard => "standard",
            ClientProfile::Aggressive => "aggressive",
        })
    }
}

/// How the client names each attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KeyMode {
    /// One key per intent, derived from the parcel: label:{order_id}:{parcel_no}:v{label_version}.
    Derived,
    /// A new random key on every attempt: docs/design.md#failure-new-key-per-attempt.
    PerAttempt,
}

/// The Fulfilment service's behaviour.
#[derive(Debug, Clone, Args)]
pub struct FulfilmentArgs {
    /// One key per intent (derived) or a new key per attempt (docs/design.md#failure-new-key-per-attempt).
    #[arg(long, value_enum, default_value_t = KeyMode::Derived)]
    pub key_mode: KeyMode,
    /// How the client retries: standard (Retry-After, a retry quota; an intent gives up when the quota is
    /// empty), polite (the same, but unpaid retries go ahead, slowed down) or aggressive (neither).
    #[arg(long, value_enum, default_value_t = ClientProfile::Standard)]
    pub client_profile: ClientProfile,
    /// Client deadline per attempt, in milliseconds.
    #[arg(long, default_value_t = DEADLINE_MS_DEFAULT)]
    pub deadline_ms: u64,
    /// Attempts per intent before giving up.
    #[arg(long, default_value_t = ATTEMPTS_MAX_DEFAULT)]
    pub attempts_max: u32,
    /// Requests on the wire at once (the client's connection pool), 1 to
    /// 10,000. An attempt waits for a connection within its deadline; one
    /// that gets none in time counts as a timeout that never reached the server.
    #[arg(long, default_value_t = CONNECTIONS_MAX_DEFAULT)]
    pub connections_max: usize,
    /// Which waiting attempt gets a connection that comes free: the oldest
    /// while the queue still empties and the newest once it has stood for
    /// 100 ms (adaptive-lifo, as the service's admission queue), or always
    /// the oldest (fifo).
    #[arg(long, value_enum, default_value_t = PoolOrder::AdaptiveLifo)]
    pub pool_order: PoolOrder,
    /// First backoff after a timeout, a connection error, 409 or 5xx, in milliseconds (doubles per attempt, full jitter).
    #[arg(long, default_value_t = BACKOFF_MS_BASE_DEFAULT)]
    pub backoff_base_ms: u64,
    /// Longest backoff, in milliseconds.
    #[arg(long, default_value_t = BACKOFF_MS_CAP_DEFAULT)]
    pub backoff_cap_ms: u64,
    /// Share of intents sent twice at once (lost-reply simulation), 0 to 1.
    #[arg(long, default_value_t = DUPLICATE_SHARE_DEFAULT)]
    pub duplicate_share: f64,
    /// Share of carrier purchases whose reply the spawned simulator drops, 0 to 1.
    #[arg(long, default_value_t = CARRIER_LOST_REPLY_RATE_DEFAULT)]
    pub carrier_lost_reply_rate: f64,
    /// Shortest simulated carrier latency of a spawned simulator, in milliseconds.
    #[arg(long, default_value_t = CARRIER_LATENCY_MS_MIN_DEFAULT)]
    pub carrier_latency_ms_min: u64,
    /// Longest simulated carrier latency of a spawned simulator, in milliseconds (uniform in between).
    #[arg(long, default_value_t = CARRIER_LATENCY_MS_MAX_DEFAULT)]
    pub carrier_latency_ms_max: u64,
    /// Bearer token of the caller.
    #[arg(long, default_value = TOKEN_DEFAULT)]
    pub token: String,
    /// Send `Prefer: wait=S` (RFC 7240) on every retry, so a retry that finds
    /// its key still in progress waits up to S seconds for the answer instead
    /// of getting 409; such an attempt's deadline is --deadline-ms plus S
    /// seconds. First attempts never carry it. 1 to 300.
    #[arg(long, value_name = "S")]
    pub prefer_wait: Option<u64>,
}

/// What shape of load http mode offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Profile {
    /// One open-loop run at --rate (or a ramp with --ramp).
    Steady,
    /// Four phases at 1x, 2x, 3x and 1x of --rate (the capacity), each --phase-s long.
    Overload,
    /// 1x of --rate for --steady-s, a trigger of --trigger-multiplier x for
    /// --trigger-s, then 1x for --after-s, reported second by second.
    Metastable,
}

/// The metastable profile's defaults: 15 s steady, 3x for 15 s, 30 s after.
pub const STEADY_S_DEFAULT: u64 = 15;
pub const TRIGGER_S_DEFAULT: u64 = 15;
pub const TRIGGER_MULTIPLIER_DEFAULT: f64 = 3.0;
pub const AFTER_S_DEFAULT: u64 = 30;

/// Seconds per phase of the overload profile: long enough for the client's
/// retries and the server's shedding to settle.
pub const PHASE_S_DEFAULT: u64 = 20;
/// Most instances `--instances` spawns.
pub const INSTANCES_MAX: usize = 16;

#[derive(Debug, Clone, Args)]
pub struct HttpArgs {
    /// steady: one run at --rate; overload: 1x, 2x, 3x, 1x of --rate;
    /// metastable: 1x, a trigger, 1x again, second by second.
    #[arg(long, value_enum, default_value_t = Profile::Steady)]
    pub profile: Profile,
    /// Seconds per phase of the overload profile.
    #[arg(long, default_value_t = PHASE_S_DEFAULT)]
    pub phase_s: u64,
    /// Metastable profile: seconds at 1x before the trigger.
    #[arg(long, default_value_t = STEADY_S_DEFAULT)]
    pub steady_s: u64,
    /// Metastable profile: seconds of the trigger.
    #[arg(long, default_value_t = TRIGGER_S_DEFAULT)]
    pub trigger_s: u64,
    /// Metastable profile: the trigger's rate as a multiple of --rate.
    #[arg(long, default_value_t = TRIGGER_MULTIPLIER_DEFAULT)]
    pub trigger_multiplier: f64,
    /// Metastable profile: seconds at 1x after the trigger.
    #[arg(long, default_value_t = AFTER_S_DEFAULT)]
    pub after_s: u64,
    /// Base URL of a running Label service instance (http://127.0.0.1:8080); repeat it for a fleet:
    /// intents start round robin and every retry goes to another instance than the last. A server is
    /// spawned when absent.
    #[arg(long = "url")]
    pub urls: Vec<String>,
    /// Base URL of the carrier simulator whose stats the audit reads (needed with --url).
    #[arg(long)]
    pub carrier_url: Option<String>,
    /// Label service instances to spawn on one shared store (a fleet): the
    /// client spreads the attempts of every intent over them. Several need a
    /// store they can share: postgres, or redis with --labels-in-postgres.
    #[arg(long, default_value_t = 1)]
    pub instances: usize,
    /// With --store-kind redis: labels in a spawned PostgreSQL (durable)
    /// instead of each instance's embedded store.
    #[arg(long)]
    pub labels_in_postgres: bool,
    /// With --store-kind redis: a spawned Redis Cluster of three masters
    /// instead of one redis-server.
    #[arg(long)]
    pub redis_cluster: bool,
    /// Pin a spawned Label service and the store servers spawned with it to
    /// CPU 0, and idem-bench and the carrier simulator to CPU 1 (taskset),
    /// so the service's figures do not depend on the client's CPU use.
    #[arg(long)]
    pub split_cpus: bool,
    /// store.kind of a spawned server.
    #[arg(long, value_enum, default_value_t = StoreKind::Embedded)]
    pub store_kind: StoreKind,
    /// The server binary to spawn (default: $IDEM_SERVER_BIN, then `server` beside this binary).
    #[arg(long)]
    pub server_bin: Option<PathBuf>,
    #[command(flatten)]
    pub fulfilment: FulfilmentArgs,
    #[command(flatten)]
    pub load: LoadArgs,
    #[command(flatten)]
    pub backend: BackendArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

impl std::fmt::Display for KeyMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KeyMode::Derived => "derived",
            KeyMode::PerAttempt => "per-attempt",
        })
    }
}

impl FulfilmentArgs {
    pub fn carrier(&self) -> crate::http_mode::spawn::CarrierSettings {
        crate::http_mode::spawn::CarrierSettings {
            lost_reply_rate: self.carrier_lost_reply_rate,
            latency_ms_min: self.carrier_latency_ms_min,
            latency_ms_max: self.carrier_latency_ms_max,
        }
    }
}
