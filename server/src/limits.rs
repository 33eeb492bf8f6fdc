//! Request limits: a cap on API requests in flight, counting the work a
//! request leaves running after its client hung up (beyond it, an immediate
//! 503 `overloaded` instead of a queue), and a per-request budget.

use crate::admission::{Admission, AdmissionConfig, Worker};
use crate::body_read::BODY_READ_TIMEOUT_MS_DEFAULT;
use crate::error::ApiError;
use crate::metrics::WORK_DONE_TOTAL;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use idem_http::{RequestDeadline, request_timeout_ms};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

#[derive(Clone)]
pub struct Limits {
    in_flight: Arc<Semaphore>,
    request_timeout: Duration,
    retry_after_s: u64,
    admission: Admission,
    body_read_timeout: Duration,
}

impl Limits {
    pub fn new(
        in_flight_max: usize,
        request_timeout: Duration,
        retry_after_s: u64,
        admission: &AdmissionConfig,
    ) -> Self {
        Self {
            in_flight: Arc::new(Semaphore::new(in_flight_max)),
            request_timeout,
            retry_after_s,
            admission: Admission::new(admission),
            body_read_timeout: Duration::from_millis(BODY_READ_TIMEOUT_MS_DEFAULT),
        }
    }

    /// The time a request's body has to arrive (`server.body_read_timeout_ms`,
    /// `body_read.rs`); [`BODY_READ_TIMEOUT_MS_DEFAULT`] unless set here.
    pub fn with_body_read_timeout(self, body_read_timeout: Duration) -> Self {
        Self {
            body_read_timeout,
            ..self
        }
    }

    pub fn body_read_timeout(&self) -> Duration {
        self.body_read_timeout
    }

    /// The admission controller behind the cap (see `admission.rs`).
    pub fn admission(&self) -> (Admission, u64) {
        (self.admission.clone(), self.retry_after_s)
    }

    /// Places under the cap not taken right now.
    pub fn free_slots(&self) -> usize {
        self.in_flight.available_permits()
    }
}

/// One admitted request's place under the cap, freed when its last clone is
/// dropped. [`shed_overload`] puts one in the request's extensions; work
/// that outlives the request (the idempotency layer's task) keeps a clone,
/// so abandoned work cannot pile up beyond the cap.
#[derive(Clone)]
pub struct InFlightSlot {
    _permit: Option<Arc<OwnedSemaphorePermit>>,
    /// The admission worker, once admitted.
    _worker: Option<Arc<Worker>>,
    /// Counts the work when its last holder lets go.
    _work: Option<Arc<WorkDone>>,
}

/// Dropped when a request's work ends (with the last clone of its slot):
/// counts it in [`WORK_DONE_TOTAL`], as work for a client still waiting or
/// for one whose deadline had passed.
struct WorkDone {
    deadline: RequestDeadline,
}

impl Drop for WorkDone {
    fn drop(&mut self) {
        let client = if self.deadline.has_passed() { "gone" } else { "waiting" };
        metrics::counter!(WORK_DONE_TOTAL, "client" => client).increment(1);
    }
}

impl InFlightSlot {
    /// A slot holding nothing (a router without the in-flight cap or
    /// admission control).
    pub fn none() -> Self {
        Self {
            _permit: None,
            _worker: None,
            _work: None,
        }
    }

    /// This slot, counting the request's work against `deadline` when it ends.
    fn counting_work(self, deadline: RequestDeadline) -> Self {
        Self {
            _work: Some(Arc::new(WorkDone { deadline })),
            ..self
        }
    }

    /// This slot with an admission worker joined to it.
    pub fn with_worker(self, worker: Worker) -> Self {
        Self {
            _worker: Some(Arc::new(worker)),
            ..self
        }
    }
}

/// Sheds load: a request that finds every slot taken is refused at once.
pub async fn shed_overload(State(limits): State<Limits>, mut request: Request, next: Next) -> Response {
    let Ok(permit) = limits.in_flight.clone().try_acquire_owned() else {
        return ApiError::Overloaded {
            retry_after_s: limits.retry_after_s,
            retry_after_ms: None,
        }
        .into_response();
    };
    let slot = InFlightSlot {
        _permit: Some(Arc::new(permit)),
        _worker: None,
        _work: None,
    };
    request.extensions_mut().insert(slot.clone());
    // Held here too: a handler may drop the request (and its extensions)
    // before it has done its work.
    let response = next.run(request).await;
    drop(slot);
    response
}

/// Answers 503 `request_timeout` when the request's budget runs out: the
/// server's `request_timeout_ms`, or sooner the client's
/// `Request-Timeout-Ms` (docs/design.md#deadlines). Idempotent work runs in
/// its own task and is not cut off by the server's own budget: it finishes
/// and saves its answer, which the caller's retry with the same key then
/// gets. Only a client that sent its deadline has one in the request
/// ([`RequestDeadline`]), which the later steps check before they start
/// work; either way, the work is counted as done for a client still waiting
/// or gone ([`WORK_DONE_TOTAL`]).
pub async fn request_timeout(State(limits): State<Limits>, mut request: Request, next: Next) -> Response {
    let client_ms = match request_timeout_ms(request.headers()) {
        Ok(client_ms) => client_ms,
        Err(invalid) => {
            return ApiError::InvalidRequest {
                detail: invalid.to_string(),
            }
            .into_response();
        }
    };
    let timeout = client_ms.map_or(limits.request_timeout, |client_ms| {
        limits.request_timeout.min(Duration::from_millis(client_ms))
    });
    let deadline = RequestDeadline::after(tokio::time::Instant::now(), timeout);
    if client_ms.is_some() {
        request.extensions_mut().insert(deadline);
    }
    if let Some(slot) = request.extensions_mut().remove::<InFlightSlot>() {
        request.extensions_mut().insert(slot.counting_work(deadline));
    }
    match tokio::time::timeout_at(deadline.0, next.run(request)).await {
        Ok(response) => response,
        Err(_elapsed) => ApiError::RequestTimeout {
            limit_ms: timeout.as_millis() as u64,
            retry_after_s: limits.retry_after_s,
        }
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::Router;
    use axum::body::Body;
    use axum::middleware::from_fn_with_state;
    use axum::routing::get;
    use tower::ServiceExt;

    /// A handler without extractors gets no request at all: axum drops it,
    /// extensions and all, before the handler runs.
    async fn slow_without_extractors() -> &'static str {
        tokio::time::sleep(Duration::from_millis(300)).await;
        "done"
    }

    #[tokio::test]
    async fn a_handler_that_drops_its_request_still_holds_its_slot_while_it_runs() {
        let limits = Limits::new(1, Duration::from_secs(5), 1, &AdmissionConfig::default());
        let router = Router::new()
            .route("/slow", get(slow_without_extractors))
            .layer(from_fn_with_state(limits.clone(), shed_overload));
        let request = || Request::get("/slow").body(Body::empty()).unwrap();
        let first = tokio::spawn(router.clone().oneshot(request()));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(limits.free_slots(), 0);
        let second = router.clone().oneshot(request()).await.unwrap();
        assert_eq!(second.status(), 503);
        assert_eq!(first.await.unwrap().unwrap().status(), 200);
        assert_eq!(limits.free_slots(), 1);
    }
}
