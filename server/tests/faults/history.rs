//! What a campaign writes down, and nothing else is read by the checker:
//!
//! | file | one line / document per |
//! |---|---|
//! | `history.jsonl` | HTTP attempt the workload sent ([`AttemptRecord`]) |
//! | `faults.jsonl` | fault window the nemeses opened and closed ([`FaultWindow`]) |
//! | `sales.json` | the carrier simulator's sale book (`GET /carrier/v1/stats`) |
//! | `labels.jsonl` | label row in the label store at the end ([`LabelRow`]) |
//! | `campaign.json` | the run itself: backend, seed, times ([`CampaignInfo`]) |

use serde::{Deserialize, Serialize};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

pub const HISTORY_FILE: &str = "history.jsonl";
pub const FAULTS_FILE: &str = "faults.jsonl";
pub const SALES_FILE: &str = "sales.json";
pub const LABELS_FILE: &str = "labels.jsonl";
pub const CAMPAIGN_FILE: &str = "campaign.json";

/// Which part of the run an attempt belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// While the nemeses run.
    Load,
    /// After every fault healed: each intent without a 201, driven again.
    Heal,
    /// At the end: each intent asked once more on every instance.
    Replay,
}

/// One HTTP attempt, as the client saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRecord {
    pub intent: u64,
    pub key: String,
    pub order_id: u64,
    pub parcel_no: u32,
    pub phase: Phase,
    /// 1 for an intent's first attempt in this phase.
    pub attempt: u32,
    pub instance: usize,
    /// Unix milliseconds.
    pub sent_ms: u64,
    pub answered_ms: u64,
    /// `None` when no answer came (a timeout, a refused or broken connection).
    pub status: Option<u16>,
    /// The transport error, or the problem's `code` of a non-2xx answer.
    pub error: Option<String>,
    pub label_id: Option<String>,
    /// The `Idempotent-Replayed: true` header.
    pub replayed: bool,
    /// SHA-256 of the body bytes, hex.
    pub body_sha256: Option<String>,
    /// The `Original-Request` header: the request id of the attempt that
    /// completed the record (each attempt has its own: the workload sends
    /// no `x-request-id`, so every instance makes a new one).
    pub original_request: Option<String>,
}

/// One fault, from when it was injected to when it was healed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultWindow {
    pub nemesis: String,
    /// `instance N`, `store`, `carrier`.
    pub target: String,
    pub start_ms: u64,
    pub end_ms: u64,
}

/// One row of the label store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabelRow {
    pub caller: String,
    pub order_id: u64,
    pub parcel_no: u32,
    pub label_version: u32,
    pub label_id: String,
}

/// The run, for the report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CampaignInfo {
    pub backend: String,
    /// `everysec` or `always` for Redis.
    pub redis_fsync: Option<String>,
    pub seed: u64,
    pub load_ms: u64,
    pub started_ms: u64,
    pub ended_ms: u64,
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis() as u64)
        .unwrap_or(0)
}

/// Appends JSON lines to one file, from any task.
pub struct JsonLines {
    path: PathBuf,
    writer: Mutex<BufWriter<std::fs::File>>,
}

impl JsonLines {
    pub fn create(path: &Path) -> Self {
        let file = std::fs::File::create(path).unwrap_or_else(|error| panic!("create {}: {error}", path.display()));
        Self {
            path: path.to_owned(),
            writer: Mutex::new(BufWriter::new(file)),
        }
    }

    pub fn append<T: Serialize>(&self, record: &T) {
        let line = serde_json::to_string(record).expect("a record serializes");
        let mut writer = self.writer.lock().expect("the history lock");
        writeln!(writer, "{line}").unwrap_or_else(|error| panic!("write {}: {error}", self.path.display()));
    }

    pub fn flush(&self) {
        let mut writer = self.writer.lock().expect("the history lock");
        writer
            .flush()
            .unwrap_or_else(|error| panic!("flush {}: {error}", self.path.display()));
    }
}

/// Reads a JSON-lines file written by [`JsonLines`].
pub fn read_lines<T: serde::de::DeserializeOwned>(path: &Path) -> Vec<T> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|error| panic!("read {}: {error}", path.display()));
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .enumerate()
        .map(|(number, line)| {
            serde_json::from_str(line)
                .unwrap_or_else(|error| panic!("{} line {}: {error}: {line}", path.display(), number + 1))
        })
        .collect()
}

/// Every label row of a PostgreSQL label store.
pub async fn postgres_label_rows(url: &str) -> Vec<LabelRow> {
    use store_postgres::tokio_postgres;
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect to the label database");
    tokio::spawn(connection);
    let rows = client
        .query(
            "SELECT caller_id, order_id::text, parcel_no, label_version, label_id FROM labels",
            &[],
        )
        .await
        .expect("read the labels");
    rows.iter()
        .map(|row| LabelRow {
            caller: row.get(0),
            order_id: row.get::<_, String>(1).parse().expect("an order id"),
            parcel_no: u32::try_from(row.get::<_, i64>(2)).expect("a parcel number"),
            label_version: u32::try_from(row.get::<_, i64>(3)).expect("a label version"),
            label_id: row.get(4),
        })
        .collect()
}
