//! The state every handler reads: the idempotency layer, where labels
//! live, the carrier client, the metrics handle, and what the probes and
//! the document report. Defined below the handlers that read it and the
//! router that builds it (`app.rs`).

use crate::carrier::CarrierClient;
use crate::idempotency::Idempotency;
use crate::labels::LabelStore;
use crate::readiness::ReadinessCell;
use metrics_exporter_prometheus::PrometheusHandle;
use std::sync::Arc;
use store_core::Policy;
use store_fdb::EmbeddedEngine;
use tokio_util::sync::CancellationToken;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub idempotency: Idempotency,
    pub labels: Arc<dyn LabelStore>,
    pub carrier: Arc<CarrierClient>,
    pub metrics: PrometheusHandle,
    pub carrier_retry_after_s: u64,
    pub store_kind: &'static str,
    /// The embedded engine, when one holds records or labels (for its metrics).
    pub embedded: Option<EmbeddedEngine>,
    /// Cancelled when shutdown begins: readiness fails from then on.
    pub shutting_down: CancellationToken,
    /// The stores' readiness as the background check last found it.
    pub readiness: ReadinessCell,
    /// The idempotency policy in force, which `/openapi.json` publishes.
    pub policy: Policy,
}
