//! Real redis-server processes for tests (feature `testkit`).
//!
//! Every server runs on a free loopback port in its own temporary directory
//! and is killed when its handle is dropped, as in redis-rs's own harness.
//! Nothing here uses a server someone else started.
//!
//! - [`RedisServer`]: one standalone server, with extra arguments, restart on
//!   the same port, kill, pause and resume.
//! - [`RedisCluster`]: three masters joined by `redis-cli --cluster create`.
//! - Either over TLS only ([`RedisServer::start_tls`],
//!   [`RedisCluster::start_tls`]) with certificates the test generates
//!   ([`TlsSetup`]): `rediss://` URLs, `--tls-cluster yes` for a cluster.
//! - [`shared_server`] / [`shared_cluster`]: one server (or cluster) shared by
//!   the tests of a binary that overlap in time, stopped when the last one
//!   lets go; [`StoreWithServer`] ties a store to the server it needs, for
//!   factories such as `store_core::conformance_tests!` that return only a store.

mod cluster;
mod server;
mod shared;

pub use cluster::{CLUSTER_MASTERS, CLUSTER_READY_MS_MAX, RedisCluster};
pub use server::{ClientAuth, REDIS_CLI_PROGRAM, REDIS_SERVER_PROGRAM, RedisServer, STARTUP_MS_MAX, TlsSetup};
pub use shared::{
    StoreWithServer, shared_cluster, shared_server, shared_tls_cluster, shared_tls_server, two_instances,
};

use std::io;
use store_core::{ClaimOutcome, ClaimRequest, StoreError};

/// Runs `requests` as one claim pipeline on a standalone server, as if they
/// had all arrived while the previous pipeline was in flight, then finishes
/// each in order as `claim` does. Returns, for each claim, what the
/// pipeline did with it (`"reply"`: answered it, `"alone"`: sent it alone
/// after, `"unavailable"`: failed it) and its outcome.
pub async fn claim_in_one_pipeline(
    store: &crate::RedisStore,
    requests: &[ClaimRequest],
) -> Vec<(&'static str, Result<ClaimOutcome, StoreError>)> {
    store.claim_in_one_pipeline(requests).await
}

/// Why a test server could not be started.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("could not run {program}: {source}")]
    Spawn {
        program: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("redis-server on port {port} is not ready after {STARTUP_MS_MAX} ms; end of its log:\n{log}")]
    NotReady { port: u16, log: String },
    #[error("redis-server on port {port} exited while starting; end of its log:\n{log}")]
    Exited { port: u16, log: String },
    #[error("redis-cli --cluster create failed:\n{output}")]
    ClusterCreate { output: String },
    #[error("the cluster did not reach cluster_state:ok within {CLUSTER_READY_MS_MAX} ms")]
    ClusterNotReady,
    #[error("test harness I/O: {0}")]
    Io(#[from] io::Error),
}
