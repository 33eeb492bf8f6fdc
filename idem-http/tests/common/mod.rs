//! What the idem-http test binaries share: the body limit of their routes,
//! and an application's cap on work in flight, which the layer's
//! `hold_during_work` hook is tested with.

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use futures::future::BoxFuture;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The largest request body the test routes read.
pub const BODY_BYTES_MAX: usize = 1_024;

/// A slot under the application's cap on work in flight.
#[derive(Clone)]
pub struct WorkSlot(#[allow(dead_code)] pub Arc<OwnedSemaphorePermit>);

/// Middleware (for `axum::middleware::from_fn`) that gives every request a
/// [`WorkSlot`] from `slots`; a request finding none free fails the test.
pub fn take_work_slot(
    slots: Arc<Semaphore>,
) -> impl Fn(Request, Next) -> BoxFuture<'static, Response> + Clone + Send + Sync + 'static {
    move |mut request: Request, next: Next| {
        let slots = slots.clone();
        Box::pin(async move {
            let permit = slots.try_acquire_owned().expect("a free slot");
            request.extensions_mut().insert(WorkSlot(Arc::new(permit)));
            next.run(request).await
        })
    }
}
