//! Startup checks on every connected node: settings under which Redis would
//! forget records are refused or reported before the first request.
//!
//! Refused: a `maxmemory-policy` that may evict keys (evicted records are
//! forgotten keys, so duplicate effects), unless the operator accepted
//! eviction; a server older than 7.0, which does not know the scripts'
//! shebang. Reported as warnings (logged with `tracing::warn!` and returned,
//! so the server can count them): no persistence at all, snapshots only,
//! an append-only file not fsynced on every write, accepted eviction, and a
//! `CONFIG` command that could not be used to check.

use crate::connection::Connection;
use crate::errors::store_error;
use redis::{RedisResult, Value};
use std::collections::HashMap;
use std::fmt;
use store_core::StoreError;

/// The oldest Redis whose scripts honour a `#!lua` shebang.
pub const REDIS_MAJOR_VERSION_MIN: u32 = 7;

/// What one node said about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    /// `host:port` of the node.
    pub node: String,
    pub redis_version: String,
    pub maxmemory_policy: String,
    pub aof_enabled: bool,
    /// `CONFIG GET save`; `None` when `CONFIG` is unavailable (renamed or
    /// disabled, as on some managed services).
    pub save: Option<String>,
    /// `CONFIG GET appendfsync`; `None` when `CONFIG` is unavailable.
    pub appendfsync: Option<String>,
}

/// A setting under which this store refuses to run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServerRefusal {
    #[error(
        "node {node}: maxmemory-policy is {policy}, which evicts keys under memory pressure; an evicted record is a forgotten key and its retry runs the effect again. Set maxmemory-policy noeviction, or set accept_eviction to run anyway"
    )]
    Eviction { node: String, policy: String },
    #[error("node {node}: Redis {version} is older than {REDIS_MAJOR_VERSION_MIN}.0, which the scripts need")]
    TooOld { node: String, version: String },
    #[error("node {node}: INFO did not report {field}")]
    Unreadable { node: String, field: &'static str },
}

/// A setting under which this store runs but may forget records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerWarning {
    /// `appendonly no` and no `save` points: a restart forgets every record.
    NoPersistence { node: String },
    /// RDB snapshots only: a crash forgets every record since the last one.
    SnapshotsOnly { node: String, save: String },
    /// An append-only file fsynced less often than every write.
    AppendFsyncNotAlways { node: String, appendfsync: String },
    /// Eviction is on and was accepted in the configuration.
    EvictionAccepted { node: String, policy: String },
    /// `CONFIG GET` failed, so persistence could not be checked.
    ConfigUnavailable { node: String },
}

impl ServerWarning {
    /// A short fixed name, for metric labels.
    pub fn kind(&self) -> &'static str {
        match self {
            ServerWarning::NoPersistence { .. } => "no_persistence",
            ServerWarning::SnapshotsOnly { .. } => "snapshots_only",
            ServerWarning::AppendFsyncNotAlways { .. } => "appendfsync_not_always",
            ServerWarning::EvictionAccepted { .. } => "eviction_accepted",
            ServerWarning::ConfigUnavailable { .. } => "config_unavailable",
        }
    }
}

impl fmt::Display for ServerWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServerWarning::NoPersistence { node } => write!(
                f,
                "node {node}: no persistence (appendonly no, no save points); a restart forgets every record"
            ),
            ServerWarning::SnapshotsOnly { node, save } => write!(
                f,
                "node {node}: RDB snapshots only (save {save:?}); a crash forgets records written since the last snapshot"
            ),
            ServerWarning::AppendFsyncNotAlways { node, appendfsync } => write!(
                f,
                "node {node}: appendfsync {appendfsync}; a crash may forget the last writes (about a second with everysec)"
            ),
            ServerWarning::EvictionAccepted { node, policy } => write!(
                f,
                "node {node}: maxmemory-policy {policy} may evict records; accepted by configuration"
            ),
            ServerWarning::ConfigUnavailable { node } => write!(
                f,
                "node {node}: CONFIG GET save/appendfsync gave no answer (renamed or disabled?); persistence was not checked"
            ),
        }
    }
}

/// What the startup checks found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerReport {
    pub nodes: Vec<NodeFacts>,
    pub warnings: Vec<ServerWarning>,
}

/// Asks every node, judges the answers, and logs each warning once.
pub(crate) async fn check_server(
    connection: &mut Connection,
    accept_eviction: bool,
) -> Result<ServerReport, StoreError> {
    let nodes = gather(connection).await?;
    let mut warnings = Vec::new();
    for facts in &nodes {
        let found = judge(facts, accept_eviction)
            .map_err(|refusal| StoreError::refused(format!("startup check: {refusal}"), refusal))?;
        warnings.extend(found);
    }
    for warning in &warnings {
        tracing::warn!(kind = warning.kind(), "redis store: {warning}");
    }
    Ok(ServerReport { nodes, warnings })
}

async fn gather(connection: &mut Connection) -> Result<Vec<NodeFacts>, StoreError> {
    // Plain INFO: its default sections include server, memory and persistence
    // on every version, so an old server reaches the version check.
    let info = every_node(connection, &redis::cmd("INFO")).await?;
    let save = every_node(connection, redis::cmd("CONFIG").arg("GET").arg("save")).await?;
    let appendfsync = every_node(connection, redis::cmd("CONFIG").arg("GET").arg("appendfsync")).await?;
    let mut nodes = Vec::new();
    for (node, answer) in info {
        let fields = info_fields(&answer.map_err(|error| store_error("INFO", error))?);
        let field = |name: &'static str| {
            fields.get(name).cloned().ok_or_else(|| {
                let refusal = ServerRefusal::Unreadable {
                    node: node.clone(),
                    field: name,
                };
                StoreError::refused(format!("startup check: {refusal}"), refusal)
            })
        };
        nodes.push(NodeFacts {
            redis_version: field("redis_version")?,
            maxmemory_policy: field("maxmemory_policy")?,
            aof_enabled: field("aof_enabled")? == "1",
            save: config_value(save.get(&node), "save"),
            appendfsync: config_value(appendfsync.get(&node), "appendfsync"),
            node,
        });
    }
    Ok(nodes)
}

async fn every_node(
    connection: &mut Connection,
    command: &redis::Cmd,
) -> Result<HashMap<String, RedisResult<Value>>, StoreError> {
    let answers = connection
        .query_every_node(command)
        .await
        .map_err(|error| store_error("startup check", error))?;
    Ok(answers.into_iter().collect())
}

/// `key:value` lines of an INFO reply.
fn info_fields(answer: &Value) -> HashMap<String, String> {
    let text = match answer {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::VerbatimString { text, .. } => text.clone(),
        Value::SimpleString(text) => text.clone(),
        _ => String::new(),
    };
    text.lines()
        .filter_map(|line| line.trim_end().split_once(':'))
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect()
}

/// The value of `CONFIG GET name`, answered as a flat array (RESP2) or a map (RESP3).
fn config_value(answer: Option<&RedisResult<Value>>, name: &str) -> Option<String> {
    let text = |value: &Value| match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(text) => Some(text.clone()),
        _ => None,
    };
    match answer? {
        Ok(Value::Array(items)) => items
            .chunks(2)
            .find(|pair| text(&pair[0]).as_deref() == Some(name))?
            .get(1)
            .and_then(text),
        Ok(Value::Map(pairs)) => pairs
            .iter()
            .find(|(key, _)| text(key).as_deref() == Some(name))
            .and_then(|(_, value)| text(value)),
        _ => None,
    }
}

/// The verdict on one node: warnings, or the reason to refuse.
pub fn judge(facts: &NodeFacts, accept_eviction: bool) -> Result<Vec<ServerWarning>, ServerRefusal> {
    let node = facts.node.clone();
    let major: u32 = facts
        .redis_version
        .split('.')
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if major < REDIS_MAJOR_VERSION_MIN {
        return Err(ServerRefusal::TooOld {
            node,
            version: facts.redis_version.clone(),
        });
    }
    let mut warnings = Vec::new();
    if facts.maxmemory_policy != "noeviction" {
        let policy = facts.maxmemory_policy.clone();
        if !accept_eviction {
            return Err(ServerRefusal::Eviction { node, policy });
        }
        warnings.push(ServerWarning::EvictionAccepted {
            node: node.clone(),
            policy,
        });
    }
    warnings.extend(persistence_warning(facts));
    Ok(warnings)
}

fn persistence_warning(facts: &NodeFacts) -> Option<ServerWarning> {
    let node = facts.node.clone();
    let (Some(save), Some(appendfsync)) = (&facts.save, &facts.appendfsync) else {
        return Some(ServerWarning::ConfigUnavailable { node });
    };
    match (facts.aof_enabled, save.trim().is_empty()) {
        (false, true) => Some(ServerWarning::NoPersistence { node }),
        (false, false) => Some(ServerWarning::SnapshotsOnly {
            node,
            save: save.clone(),
        }),
        (true, _) if appendfsync != "always" => Some(ServerWarning::AppendFsyncNotAlways {
            node,
            appendfsync: appendfsync.clone(),
        }),
        (true, _) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(policy: &str, aof: bool, save: &str, appendfsync: &str) -> NodeFacts {
        NodeFacts {
            node: "127.0.0.1:7000".into(),
            redis_version: "7.0.15".into(),
            maxmemory_policy: policy.into(),
            aof_enabled: aof,
            save: Some(save.into()),
            appendfsync: Some(appendfsync.into()),
        }
    }

    #[test]
    fn eviction_is_refused_unless_accepted() {
        let lru = facts("allkeys-lru", true, "", "always");
        assert!(matches!(judge(&lru, false), Err(ServerRefusal::Eviction { .. })));
        let accepted = judge(&lru, true).unwrap();
        assert_eq!(
            accepted.iter().map(ServerWarning::kind).collect::<Vec<_>>(),
            ["eviction_accepted"]
        );
        assert!(judge(&facts("volatile-ttl", true, "", "always"), false).is_err());
        assert_eq!(judge(&facts("noeviction", true, "", "always"), false), Ok(vec![]));
    }

    #[test]
    fn persistence_gaps_are_warnings() {
        let kinds = |facts: NodeFacts| {
            judge(&facts, false)
                .unwrap()
                .iter()
                .map(ServerWarning::kind)
                .collect::<Vec<_>>()
        };
        assert_eq!(kinds(facts("noeviction", false, "", "everysec")), ["no_persistence"]);
        assert_eq!(
            kinds(facts("noeviction", false, "3600 1", "everysec")),
            ["snapshots_only"]
        );
        assert_eq!(
            kinds(facts("noeviction", true, "", "everysec")),
            ["appendfsync_not_always"]
        );
        let mut hidden = facts("noeviction", true, "", "always");
        hidden.save = None;
        assert_eq!(kinds(hidden), ["config_unavailable"]);
    }

    #[test]
    fn servers_older_than_seven_are_refused() {
        let mut old = facts("noeviction", true, "", "always");
        old.redis_version = "6.2.14".into();
        assert!(matches!(judge(&old, false), Err(ServerRefusal::TooOld { .. })));
    }

    #[test]
    fn config_get_answers_are_read_in_both_protocols() {
        let bulk = |text: &str| Value::BulkString(text.as_bytes().to_vec());
        let resp2 = Ok(Value::Array(vec![bulk("save"), bulk("3600 1")]));
        assert_eq!(config_value(Some(&resp2), "save").as_deref(), Some("3600 1"));
        let resp3 = Ok(Value::Map(vec![(bulk("save"), bulk(""))]));
        assert_eq!(config_value(Some(&resp3), "save").as_deref(), Some(""));
        assert_eq!(config_value(None, "save"), None);
    }
}
