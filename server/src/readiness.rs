//! The stores' readiness as last checked, which `/readyz` answers from.
//!
//! A probe that reached the stores on every request would put a store
//! round trip (and, in front of PostgreSQL, a pool connection) at the
//! disposal of anyone who can reach `/readyz`, outside every cap the API
//! has. So the stores are checked by one background task, every
//! `server.readiness_refresh_ms` (`probes.rs`), and the probe only reads
//! the result: as Kubernetes' own components and Envoy's health checks do,
//! a flood of probes costs the stores nothing.

use idem_http::IdempotencyError;
use std::sync::{Arc, Mutex, PoisonError};

/// What the last check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked {
    /// Records and labels answered.
    Ready,
    /// A store did not answer (or not in time): the answer the probe gives.
    Unreachable(IdempotencyError),
}

/// The last check, shared by the task that makes it and the probe. Cheap
/// to clone: clones share the cell.
#[derive(Debug, Clone)]
pub struct ReadinessCell {
    checked: Arc<Mutex<Checked>>,
}

impl ReadinessCell {
    /// A cell holding `first`, the check made before serving.
    pub fn new(first: Checked) -> Self {
        Self {
            checked: Arc::new(Mutex::new(first)),
        }
    }

    pub fn set(&self, checked: Checked) {
        *self.checked.lock().unwrap_or_else(PoisonError::into_inner) = checked;
    }

    pub fn get(&self) -> Checked {
        self.checked.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}
