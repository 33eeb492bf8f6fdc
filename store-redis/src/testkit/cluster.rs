//! A real Redis Cluster: three masters on loopback, no replicas.

use super::HarnessError;
use super::server::{REDIS_CLI_PROGRAM, RedisServer, TlsSetup, free_port};
use crate::config::RedisConfig;
use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant};

/// Masters in a test cluster: the fewest Redis Cluster accepts.
pub const CLUSTER_MASTERS: usize = 3;
/// Longest wait for every node to report `cluster_state:ok`.
pub const CLUSTER_READY_MS_MAX: u64 = 15_000;
/// Pause between readiness probes.
const PROBE_INTERVAL_MS: u64 = 50;
/// How long a node may be unreachable before the others mark it failing.
const NODE_TIMEOUT_MS: &str = "5000";

/// Three redis-server nodes joined into one cluster; all are killed on drop.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    tls: Option<TlsSetup>,
}

impl RedisCluster {
    /// Starts the nodes, joins them with
    /// `redis-cli --cluster create ... --cluster-replicas 0 --cluster-yes`
    /// and waits until every node reports `cluster_state:ok`.
    pub fn start() -> Result<Self, HarnessError> {
        Self::start_with(None)
    }

    /// As [`RedisCluster::start`], every node speaking TLS only, the cluster
    /// bus too (`--tls-cluster yes`), so the slot map hands out TLS ports.
    pub fn start_tls(tls: TlsSetup) -> Result<Self, HarnessError> {
        Self::start_with(Some(tls))
    }

    fn start_with(tls: Option<TlsSetup>) -> Result<Self, HarnessError> {
        let nodes = (0..CLUSTER_MASTERS)
            .map(|_| start_node(tls.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        let cluster = Self { nodes, tls };
        cluster.create()?;
        cluster.wait_until_ready()?;
        Ok(cluster)
    }

    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// `redis://127.0.0.1:PORT` (`rediss://` over TLS) of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// A store configuration for this cluster, every other setting at its default.
    pub fn config(&self) -> RedisConfig {
        RedisConfig {
            tls: self.tls.as_ref().map(TlsSetup::store_tls).unwrap_or_default(),
            ..RedisConfig::cluster(self.urls())
        }
    }

    fn create(&self) -> Result<(), HarnessError> {
        let addresses: Vec<String> = self
            .nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port()))
            .collect();
        let tls_args = self.tls.as_ref().map(TlsSetup::cli_args).unwrap_or_default();
        let output = Command::new(REDIS_CLI_PROGRAM)
            .args(&tls_args)
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .map_err(|source| HarnessError::Spawn {
                program: REDIS_CLI_PROGRAM,
                source,
            })?;
        if output.status.success() {
            return Ok(());
        }
        Err(HarnessError::ClusterCreate {
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ),
        })
    }

    /// Every node must see the whole cluster as healthy, or the client may
    /// learn a partial slot map from whichever node it asks first.
    fn wait_until_ready(&self) -> Result<(), HarnessError> {
        let deadline = Instant::now() + Duration::from_millis(CLUSTER_READY_MS_MAX);
        let known_nodes = format!("cluster_known_nodes:{CLUSTER_MASTERS}");
        while Instant::now() < deadline {
            let ready = self.nodes.iter().all(|node| {
                node.query::<String>(&["CLUSTER", "INFO"]).is_ok_and(|info| {
                    info.contains("cluster_state:ok")
                        && info.contains("cluster_slots_ok:16384")
                        && info.contains(&known_nodes)
                })
            });
            if ready {
                return Ok(());
            }
            sleep(Duration::from_millis(PROBE_INTERVAL_MS));
        }
        Err(HarnessError::ClusterNotReady)
    }
}

/// One cluster-enabled node; its cluster bus gets its own free port, since
/// the default (port + 10000) may be taken or out of range.
fn start_node(tls: Option<TlsSetup>) -> Result<RedisServer, HarnessError> {
    let bus_port = free_port()?.to_string();
    let mut args = vec![
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-port",
        &bus_port,
        "--cluster-node-timeout",
        NODE_TIMEOUT_MS,
    ];
    if tls.is_some() {
        args.extend(["--tls-cluster", "yes"]);
    }
    RedisServer::start_with(&args, tls)
}
