//! Claims batched across calls on a standalone server: the claim scripts
//! that arrive while a batch is in flight go out as one pipeline, one write
//! and one round trip for the batch (store-core's [`Batcher`]).
//!
//! Redis runs a pipeline's scripts one after the other, in order, each
//! atomically, so a batch is exactly its claims one after the other: two
//! claims of one key in a batch see each other as if they had been sent
//! apart. Each script's reply is the claim's own (the pipeline ignores
//! errors, so one claim's error is not another's). A claim whose script was
//! not loaded (a `NOSCRIPT` after a restart emptied the script cache) goes
//! alone, through [`redis::Script`]'s own invocation, which loads it; so
//! does a claim whose script failed otherwise, where its own call reports
//! the error as every call does. A server that did not answer, or said
//! "not now", fails the pipeline's claims as it would have failed each
//! alone: unavailable, retryable (a claim re-sent with its token gets its
//! own lease back).
//!
//! Only on a standalone server: Redis Cluster takes a pipeline only when
//! every key in it is in one slot, and every record has a slot of its own.

use crate::connection::Connection;
use crate::errors::store_error;
use crate::keys::RecordKeys;
use async_trait::async_trait;
use redis::{ErrorKind, RedisError, RedisResult, Script, ServerErrorKind, Value};
use store_core::{BatchRunner, Batcher, StoreError};

/// Claims waiting for a batch at most; past it a claim is refused as
/// unavailable at once.
pub const CLAIM_BATCH_QUEUED_ITEMS_MAX: usize = 4_096;
/// Claim batches in flight at once: one pipeline is written while the
/// other's replies come back.
pub const CLAIM_BATCHES_IN_FLIGHT_MAX: usize = 2;

/// One claim script of a batch: its record's keys and its arguments.
#[derive(Debug, Clone)]
pub(crate) struct ScriptItem {
    pub keys: RecordKeys,
    pub args: Vec<Vec<u8>>,
}

/// What the batch got for one claim.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum BatchedScript {
    /// The script's reply.
    Reply(Value),
    /// No reply for this claim from the pipeline: it goes alone.
    Alone,
    /// The server did not answer, or said "not now": the claim fails as it
    /// would have alone (retryable), rather than wait once more.
    Unavailable(String),
}

impl BatchedScript {
    /// A short name for the outcome, for the tests' assertions.
    #[cfg(feature = "testkit")]
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            BatchedScript::Reply(_) => "reply",
            BatchedScript::Alone => "alone",
            BatchedScript::Unavailable(_) => "unavailable",
        }
    }
}

/// Runs claim batches as pipelines on the store's connection.
pub(crate) struct ClaimBatchRunner {
    pub connection: Connection,
    pub script: Script,
}

pub(crate) type ClaimBatcher = Batcher<ClaimBatchRunner>;

#[async_trait]
impl BatchRunner for ClaimBatchRunner {
    type Item = ScriptItem;
    type Outcome = BatchedScript;

    async fn run(&self, items: Vec<ScriptItem>) -> Vec<BatchedScript> {
        let mut pipeline = redis::pipe();
        pipeline.ignore_errors();
        for item in &items {
            let mut invocation = self.script.key(&item.keys.record);
            invocation.key(&item.keys.tombstone);
            for arg in &item.args {
                invocation.arg(arg.as_slice());
            }
            pipeline.invoke_script(&invocation);
        }
        let mut connection = self.connection.clone();
        let replies: RedisResult<Vec<RedisResult<Value>>> = pipeline.query_async(&mut connection).await;
        match replies {
            Ok(replies) if replies.len() == items.len() => replies
                .into_iter()
                .map(|reply| match reply {
                    Ok(value) => BatchedScript::Reply(value),
                    Err(error) => failed_script(error),
                })
                .collect(),
            Ok(replies) => {
                tracing::warn!(
                    claims = items.len(),
                    replies = replies.len(),
                    "a claim pipeline answered a different number of replies; each claim goes alone"
                );
                vec![BatchedScript::Alone; items.len()]
            }
            Err(error) => vec![failed_script(error); items.len()],
        }
    }
}

/// What a claim does after its script (or its whole pipeline) failed:
/// what would fail it alone fails it now; a script the server did not have
/// loaded, or any other error, sends it alone, where its own invocation
/// loads the script and reports the error as every call does.
fn failed_script(error: RedisError) -> BatchedScript {
    if error.kind() == ErrorKind::Server(ServerErrorKind::NoScript) {
        return BatchedScript::Alone;
    }
    match store_error("claim", error) {
        error @ StoreError::Unavailable { .. } => BatchedScript::Unavailable(error.to_string()),
        error => {
            tracing::debug!(%error, "a pipelined claim failed; the claim goes alone");
            BatchedScript::Alone
        }
    }
}
