//! One connection type for both deployments: a reconnecting
//! [`ConnectionManager`] for a standalone server, the async cluster client for
//! Redis Cluster. Both pipeline many tokio tasks over few sockets and are
//! cheap to clone.

use crate::config::RedisConfig;
use redis::TlsCertificates;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, RedisFuture, RedisResult, Value};
use std::time::Duration;

/// Reconnection attempts after a standalone connection drops, before the
/// calls waiting on it fail (they fail as `Unavailable`, and the next call
/// starts a new round).
pub const RECONNECT_RETRIES_MAX: usize = 2;
/// Shortest pause between reconnection attempts.
pub const RECONNECT_DELAY_MS_MIN: u64 = 50;
/// Longest pause between reconnection attempts.
pub const RECONNECT_DELAY_MS_MAX: u64 = 500;
/// Retries of one cluster request (redirections, reconnections) within its
/// response timeout.
pub const CLUSTER_RETRIES_MAX: u32 = 3;

#[derive(Clone)]
pub(crate) enum Connection {
    /// The manager and the server's `host:port`, for messages.
    Standalone(ConnectionManager, String),
    Cluster(ClusterConnection),
}

impl Connection {
    /// Connects to the deployment `config` names; with `certificates`
    /// (`rediss://` URLs), over TLS that trusts and presents them.
    pub async fn open(config: &RedisConfig, certificates: Option<TlsCertificates>) -> RedisResult<Self> {
        if config.cluster {
            open_cluster(config, certificates).await.map(Connection::Cluster)
        } else {
            open_standalone(config, certificates).await
        }
    }

    /// Sends `command` to the primary that owns `key` (any key of the
    /// record's slot): used for `WAIT`, which must go where the write went.
    pub async fn query_at_key(&mut self, key: &str, command: &Cmd) -> RedisResult<Value> {
        match self {
            Connection::Standalone(manager, _) => command.query_async(manager).await,
            Connection::Cluster(cluster) => {
                let route = Route::with_key(key, SlotAddr::Master);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                cluster.route_command(command.clone(), routing).await
            }
        }
    }

    /// Sends `command` to every node, primaries and replicas, and returns
    /// each node's name with its answer or error.
    pub async fn query_every_node(&mut self, command: &Cmd) -> RedisResult<Vec<(String, RedisResult<Value>)>> {
        match self {
            Connection::Standalone(manager, address) => Ok(vec![(address.clone(), command.query_async(manager).await)]),
            Connection::Cluster(cluster) => {
                let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllNodes, None));
                let answers = cluster.route_command(command.clone(), routing).await?;
                Ok(per_node(answers))
            }
        }
    }
}

/// Splits the address-to-answer map the cluster client returns for a
/// command sent to several nodes without a response policy.
fn per_node(answers: Value) -> Vec<(String, RedisResult<Value>)> {
    let Value::Map(pairs) = answers else {
        return vec![("cluster".to_owned(), Ok(answers))];
    };
    pairs
        .into_iter()
        .map(|(address, answer)| {
            let name = match address {
                Value::BulkString(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                other => format!("{other:?}"),
            };
            let answer = match answer {
                Value::ServerError(error) => Err(error.into()),
                value => Ok(value),
            };
            (name, answer)
        })
        .collect()
}

async fn open_standalone(config: &RedisConfig, certificates: Option<TlsCertificates>) -> RedisResult<Connection> {
    let url = config.urls.first().map(String::as_str).unwrap_or_default();
    let client = match certificates {
        Some(certificates) => redis::Client::build_with_tls(url, certificates)?,
        None => redis::Client::open(url)?,
    };
    // The address without any password the URL may carry.
    let address = client.get_connection_info().addr().to_string();
    let manager_config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(config.response_timeout()))
        .set_connection_timeout(Some(config.connection_timeout()))
        .set_number_of_retries(RECONNECT_RETRIES_MAX)
        .set_min_delay(Duration::from_millis(RECONNECT_DELAY_MS_MIN))
        .set_max_delay(Duration::from_millis(RECONNECT_DELAY_MS_MAX));
    let manager = ConnectionManager::new_with_config(client, manager_config).await?;
    Ok(Connection::Standalone(manager, address))
}

async fn open_cluster(config: &RedisConfig, certificates: Option<TlsCertificates>) -> RedisResult<ClusterConnection> {
    let mut builder = ClusterClientBuilder::new(config.urls.iter().map(String::as_str));
    if let Some(certificates) = certificates {
        builder = builder.certs(certificates);
    }
    let client = builder
        .response_timeout(config.response_timeout())
        .overall_response_timeout(Some(config.response_timeout()))
        .connection_timeout(config.connection_timeout())
        .retries(CLUSTER_RETRIES_MAX)
        .build()?;
    client.get_async_connection().await
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Standalone(manager, _) => manager.req_packed_command(cmd),
            Connection::Cluster(cluster) => cluster.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Standalone(manager, _) => manager.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(cluster) => cluster.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Standalone(manager, _) => manager.get_db(),
            Connection::Cluster(cluster) => cluster.get_db(),
        }
    }
}
