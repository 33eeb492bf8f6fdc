//! Metric names, their descriptions, and the process-wide Prometheus recorder.
//!
//! The idempotency layer's own counters (`idem_lease_takeovers_total`,
//! `idem_lease_lost_completions_total`, `idem_late_keys_total`,
//! `idem_completion_failures_total`, `idem_responses_not_saved_total`,
//! `idem_claim_resends_total`) and its wait metrics (`idem_waiters`,
//! `idem_waits_total{outcome}`, `idem_wait_duration_seconds{outcome}`) are
//! named by idem-http under its default prefix `idem_`
//! ([`idem_http::metrics::MetricNames`]); they are described and registered
//! at zero here with the rest.
//!
//! Names follow Prometheus conventions (`_total` counters, `_seconds`
//! histograms, base units). Every label has a bounded set of values: routes
//! are matched patterns (`/v1/labels/{label_id}`), never raw paths; outcomes
//! and operations are fixed strings; no label carries a caller, a key or an id.

use idem_http::metrics::MetricNames;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::sync::OnceLock;

/// Requests answered, by `route`, `method`, `status` and `outcome`.
pub const HTTP_REQUESTS_TOTAL: &str = "idem_http_requests_total";
/// Time from the first byte of a request to its answer, by `route` and `method`.
pub const HTTP_REQUEST_DURATION_SECONDS: &str = "idem_http_request_duration_seconds";
/// Requests being served right now.
pub const HTTP_REQUESTS_IN_FLIGHT: &str = "idem_http_requests_in_flight";
/// The cap on requests in flight (`server.in_flight_max`), so an alert can
/// compare the gauge above with the cap this process runs with.
pub const HTTP_REQUESTS_IN_FLIGHT_MAX: &str = "idem_http_requests_in_flight_max";
/// Requests refused by admission control, by `reason` (`queue_delay`,
/// `queue_full`, `caller_share`, `deadline`).
pub const ADMISSION_SHED_TOTAL: &str = "idem_admission_shed_total";
/// Requests waiting for an admission worker right now.
pub const ADMISSION_QUEUE_WAITING: &str = "idem_admission_queue_waiting";
/// The time admitted work has lately taken, from admission to its end (a
/// running mean): a request that must queue is shed once its deadline
/// leaves less (`admission::WorkTime`).
pub const ADMISSION_WORK_EXPECTED_SECONDS: &str = "idem_admission_work_expected_seconds";
/// Workers lent, ahead of the pool, to work coming back from the carrier
/// when none was free (repaid by the next workers given back).
pub const ADMISSION_WORKERS_BORROWED_TOTAL: &str = "idem_admission_workers_borrowed_total";
/// Requests whose work ended, by whether their client was still waiting
/// (`client`: `waiting`, or `gone` once the request's deadline had passed:
/// work nobody read, the waste a metastable overload feeds on).
pub const WORK_DONE_TOTAL: &str = "idem_work_done_total";
/// The values of [`WORK_DONE_TOTAL`]'s `client` label.
pub const WORK_DONE_CLIENTS: [&str; 2] = ["waiting", "gone"];
/// Store calls, by `backend`, `operation` and `result` (`ok` or `error`).
pub const STORE_OPERATION_DURATION_SECONDS: &str = "idem_store_operation_duration_seconds";
/// Records deleted by the sweeper.
pub const RECORDS_PURGED_TOTAL: &str = "idem_records_purged_total";
/// Tombstones deleted by the sweeper.
pub const TOMBSTONES_PURGED_TOTAL: &str = "idem_tombstones_purged_total";
/// Sweeper runs, by `result`.
pub const SWEEPER_RUNS_TOTAL: &str = "idem_sweeper_runs_total";
/// Duration of one sweeper run.
pub const SWEEPER_RUN_DURATION_SECONDS: &str = "idem_sweeper_run_duration_seconds";
/// Carrier calls, by `outcome`.
pub const CARRIER_CALLS_TOTAL: &str = "idem_carrier_calls_total";
/// Duration of one carrier call, by `outcome`.
pub const CARRIER_CALL_DURATION_SECONDS: &str = "idem_carrier_call_duration_seconds";
/// Carrier calls repeated within their request (`carrier::retry`).
pub const CARRIER_RETRIES_TOTAL: &str = "idem_carrier_retries_total";
/// Carrier retries the retry budget refused: the carrier failed too often.
pub const CARRIER_RETRIES_THROTTLED_TOTAL: &str = "idem_carrier_retries_throttled_total";
/// Label requests answered with a label the parcel already had (the
/// uniqueness constraint as the second line of defence).
pub const LABELS_EXISTING_TOTAL: &str = "idem_labels_existing_total";
/// Undecodable records the purge set aside instead of stopping at them
/// (the FDB-style store); each is logged once with its key's SHA-256.
pub const RECORDS_QUARANTINED_TOTAL: &str = "idem_records_quarantined_total";
/// Bytes the embedded store takes on disk (embedded stores only; read at scrape).
pub const EMBEDDED_DISK_BYTES: &str = "idem_embedded_disk_bytes";
/// Tables in the embedded store's level 0 (read at scrape): fjall slows
/// writes from 20 and halts them at 30, until compaction catches up.
pub const EMBEDDED_LEVEL_ZERO_TABLES: &str = "idem_embedded_level_zero_tables";
/// The embedded store's sealed memtables waiting for a flush (read at
/// scrape): fjall halts writes while 4 wait.
pub const EMBEDDED_SEALED_MEMTABLES: &str = "idem_embedded_sealed_memtables";
/// The embedded store's compactions running (read at scrape).
pub const EMBEDDED_COMPACTIONS_RUNNING: &str = "idem_embedded_compactions_running";
/// Times the embedded store was reopened after a failed write (read at scrape).
pub const EMBEDDED_REOPENS_TOTAL: &str = "idem_embedded_reopens_total";

/// Client connections open right now.
pub const CONNECTIONS_OPEN: &str = "idem_connections_open";
/// Connections closed at once because their peer address already held
/// `server.connections_per_peer_max` of them.
pub const CONNECTIONS_PEER_CAP_REFUSED_TOTAL: &str = "idem_connections_peer_cap_refused_total";
/// 1 while the last readiness check found the stores reachable, else 0
/// (checked in the background; `/readyz` answers from it).
pub const READY: &str = "idem_ready";
/// Background readiness checks, by `result` (`ok` or `error`).
pub const READINESS_CHECKS_TOTAL: &str = "idem_readiness_checks_total";

/// Histogram buckets for every `_seconds` metric: 1 ms to 30 s.
pub const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0,
];

static HANDLE: OnceLock<Result<PrometheusHandle, String>> = OnceLock::new();

/// The process-wide recorder's handle, installing it on first use. Several
/// apps in one process (tests) share it, as they share the `metrics` facade.
pub fn prometheus_handle() -> Result<PrometheusHandle, String> {
    HANDLE
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), SECONDS_BUCKETS)
                .map_err(|error| error.to_string())?
                .install_recorder()
                .map_err(|error| error.to_string())?;
            describe();
            Ok(handle)
        })
        .clone()
}

fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    MetricNames::default().describe();
    describe_counter!(
        HTTP_REQUESTS_TOTAL,
        "Requests answered, by route, method, status and outcome."
    );
    describe_histogram!(
        HTTP_REQUEST_DURATION_SECONDS,
        Unit::Seconds,
        "Time to answer a request."
    );
    describe_gauge!(HTTP_REQUESTS_IN_FLIGHT, "Requests being served.");
    describe_gauge!(
        HTTP_REQUESTS_IN_FLIGHT_MAX,
        "The cap on requests in flight (server.in_flight_max)."
    );
    describe_counter!(
        ADMISSION_SHED_TOTAL,
        "Requests refused by admission control before any work, by reason."
    );
    describe_gauge!(ADMISSION_QUEUE_WAITING, "Requests waiting for an admission worker.");
    describe_gauge!(
        ADMISSION_WORK_EXPECTED_SECONDS,
        "The time admitted work has lately taken (a running mean); a queued request's deadline must leave it."
    );
    describe_counter!(
        WORK_DONE_TOTAL,
        "Requests whose work ended, by whether the client was still waiting (its deadline not yet passed)."
    );
    describe_counter!(
        ADMISSION_WORKERS_BORROWED_TOTAL,
        "Workers lent ahead of the pool to work coming back from the carrier."
    );
    describe_histogram!(
        STORE_OPERATION_DURATION_SECONDS,
        Unit::Seconds,
        "Duration of store calls, by backend, operation and result."
    );
    describe_counter!(RECORDS_PURGED_TOTAL, "Expired records deleted by the sweeper.");
    describe_counter!(TOMBSTONES_PURGED_TOTAL, "Expired tombstones deleted by the sweeper.");
    describe_counter!(SWEEPER_RUNS_TOTAL, "Sweeper runs, by result.");
    describe_histogram!(
        SWEEPER_RUN_DURATION_SECONDS,
        Unit::Seconds,
        "Duration of one sweeper run."
    );
    describe_counter!(CARRIER_CALLS_TOTAL, "Carrier calls, by outcome.");
    describe_counter!(
        CARRIER_RETRIES_TOTAL,
        "Carrier calls repeated within their request after a dropped connection or a 5xx."
    );
    describe_counter!(
        CARRIER_RETRIES_THROTTLED_TOTAL,
        "Carrier retries not made because the retry budget was spent."
    );
    describe_histogram!(
        CARRIER_CALL_DURATION_SECONDS,
        Unit::Seconds,
        "Duration of carrier calls, by outcome."
    );
    describe_counter!(
        LABELS_EXISTING_TOTAL,
        "Label requests answered with the parcel's existing label."
    );
    describe_counter!(
        RECORDS_QUARANTINED_TOTAL,
        "Undecodable records the purge set aside (each logged once with its key's SHA-256)."
    );
    describe_gauge!(
        EMBEDDED_DISK_BYTES,
        Unit::Bytes,
        "Bytes the embedded store takes on disk."
    );
    describe_gauge!(
        EMBEDDED_LEVEL_ZERO_TABLES,
        "Tables in the embedded store's level 0; fjall slows writes from 20 and halts them at 30."
    );
    describe_gauge!(
        EMBEDDED_SEALED_MEMTABLES,
        "The embedded store's memtables waiting for a flush; fjall halts writes while 4 wait."
    );
    describe_gauge!(
        EMBEDDED_COMPACTIONS_RUNNING,
        "The embedded store's compactions running."
    );
    describe_counter!(
        EMBEDDED_REOPENS_TOTAL,
        "Times the embedded store was reopened after a failed write or sync."
    );
    describe_gauge!(CONNECTIONS_OPEN, "Client connections open.");
    describe_counter!(
        CONNECTIONS_PEER_CAP_REFUSED_TOTAL,
        "Connections closed at once: their peer address held server.connections_per_peer_max already."
    );
    describe_gauge!(
        READY,
        "1 while the last background readiness check reached the stores, else 0."
    );
    describe_counter!(READINESS_CHECKS_TOTAL, "Background readiness checks, by result.");
}

/// `result` labels of a sweeper run.
pub const SWEEPER_RESULTS: [&str; 2] = ["ok", "error"];

/// The label values of the series [`register_at_zero`] exports, given by
/// the modules that own them (the router gathers them), so this module
/// names metrics and imports nothing of the code it measures.
#[derive(Debug, Clone)]
pub struct LabelSets {
    /// The record store's `backend` label.
    pub records_backend: &'static str,
    /// `reason`s of [`ADMISSION_SHED_TOTAL`].
    pub shed_reasons: Vec<&'static str>,
    /// `outcome`s of the carrier call metrics.
    pub carrier_outcomes: &'static [&'static str],
    /// `operation`s of [`STORE_OPERATION_DURATION_SECONDS`].
    pub record_operations: &'static [&'static str],
    /// `result`s of [`STORE_OPERATION_DURATION_SECONDS`].
    pub store_results: &'static [&'static str],
    /// Every `(route, method)` the router serves.
    pub routes: &'static [(&'static str, &'static str)],
    /// The `(route, method, status, outcome)` answers the error alerts
    /// watch: the label route's 5xx.
    pub watched_answers: Vec<WatchedAnswer>,
}

/// One `idem_http_requests_total` series registered at zero.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchedAnswer {
    pub route: &'static str,
    pub method: &'static str,
    pub status: String,
    pub outcome: &'static str,
}

/// Exports every counter and histogram at zero before its first event.
/// Prometheus' `increase(x[15m]) > 0` needs a sample from before the event:
/// a series born with the event itself has none, so the first late key,
/// lost completion or failed sweep would never fire its alert. Counters
/// with a fixed label set are registered with every value; the request
/// counter with the 5xx answers of the label route (what the error alerts
/// watch); histograms with every label set they can have here.
pub fn register_at_zero(labels: &LabelSets) {
    MetricNames::default().register_at_zero();
    for name in [
        RECORDS_PURGED_TOTAL,
        TOMBSTONES_PURGED_TOTAL,
        LABELS_EXISTING_TOTAL,
        RECORDS_QUARANTINED_TOTAL,
        CARRIER_RETRIES_TOTAL,
        CARRIER_RETRIES_THROTTLED_TOTAL,
        CONNECTIONS_PEER_CAP_REFUSED_TOTAL,
    ] {
        metrics::counter!(name).increment(0);
    }
    for result in SWEEPER_RESULTS {
        metrics::counter!(SWEEPER_RUNS_TOTAL, "result" => result).increment(0);
    }
    for reason in &labels.shed_reasons {
        metrics::counter!(ADMISSION_SHED_TOTAL, "reason" => *reason).increment(0);
    }
    metrics::gauge!(ADMISSION_QUEUE_WAITING).set(0.0);
    metrics::gauge!(ADMISSION_WORK_EXPECTED_SECONDS).set(0.0);
    metrics::counter!(ADMISSION_WORKERS_BORROWED_TOTAL).increment(0);
    for client in WORK_DONE_CLIENTS {
        metrics::counter!(WORK_DONE_TOTAL, "client" => client).increment(0);
    }
    registered(metrics::histogram!(SWEEPER_RUN_DURATION_SECONDS));
    for outcome in labels.carrier_outcomes {
        metrics::counter!(CARRIER_CALLS_TOTAL, "outcome" => *outcome).increment(0);
        registered(metrics::histogram!(CARRIER_CALL_DURATION_SECONDS, "outcome" => *outcome));
    }
    for operation in labels.record_operations {
        for result in labels.store_results {
            registered(metrics::histogram!(STORE_OPERATION_DURATION_SECONDS,
                "backend" => labels.records_backend, "operation" => *operation, "result" => *result));
        }
    }
    register_requests_at_zero(labels);
}

/// Exports the limits this process runs with, for the saturation alerts.
pub fn export_limits(in_flight_max: usize) {
    metrics::gauge!(HTTP_REQUESTS_IN_FLIGHT_MAX).set(in_flight_max as f64);
}

/// Takes a histogram's handle and lets it go: asking the recorder for it is
/// what registers the series (with empty buckets); nothing is recorded.
fn registered(_histogram: metrics::Histogram) {}

fn register_requests_at_zero(labels: &LabelSets) {
    for (route, method) in labels.routes {
        registered(metrics::histogram!(HTTP_REQUEST_DURATION_SECONDS, "route" => *route, "method" => *method));
    }
    for answer in &labels.watched_answers {
        metrics::counter!(HTTP_REQUESTS_TOTAL, "route" => answer.route, "method" => answer.method,
            "status" => answer.status.clone(), "outcome" => answer.outcome)
        .increment(0);
    }
}

/// Sets the embedded store's gauges from the engine, at each scrape.
pub fn observe_embedded(engine: &store_fdb::EmbeddedEngine) {
    metrics::gauge!(EMBEDDED_DISK_BYTES).set(engine.disk_space_bytes() as f64);
    let backlog = engine.write_backlog();
    metrics::gauge!(EMBEDDED_LEVEL_ZERO_TABLES).set(backlog.level_zero_tables as f64);
    metrics::gauge!(EMBEDDED_SEALED_MEMTABLES).set(backlog.sealed_memtables as f64);
    metrics::gauge!(EMBEDDED_COMPACTIONS_RUNNING).set(backlog.compactions_running as f64);
    metrics::counter!(EMBEDDED_REOPENS_TOTAL).absolute(engine.reopens());
}
