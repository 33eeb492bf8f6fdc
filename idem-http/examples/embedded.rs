//! A minimal axum application with one idempotent route, `POST /orders`,
//! on the embedded store (store-fdb's fjall engine) in a temporary
//! directory.
//!
//! ```text
//! cargo run -p idem-http --example embedded            # serves on 127.0.0.1:3000
//! curl -i -X POST 127.0.0.1:3000/orders -H 'Idempotency-Key: order-1' -d '{"item":"tea"}'
//! curl -i -X POST 127.0.0.1:3000/orders -H 'Idempotency-Key: order-1' -d '{"item":"tea"}'
//! # the same 201 again, with `idempotent-replayed: true`; the order was made once
//! ```
//!
//! [`app`] builds the router, so the tests in `idem-http/tests/examples.rs`
//! call it in-process with `tower::ServiceExt::oneshot`.

use axum::Router;
use axum::extract::State;
use axum::handler::Handler;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::post;
use idem_http::{Idempotency, IdempotencyLayer, SingleCaller};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use store_core::{CallerId, IdempotencyStore, Policy};
use store_fdb::{EmbeddedConfig, EmbeddedStore};

/// Largest order body the route reads; larger ones get 413.
pub const ORDER_BODY_BYTES_MAX: usize = 16 * 1024;
/// Where the example listens unless an address is given as its argument.
pub const LISTEN_ADDRESS_DEFAULT: &str = "127.0.0.1:3000";

/// The orders made so far: the effect the key protects.
#[derive(Clone, Default)]
pub struct Orders {
    made: Arc<AtomicU64>,
}

impl Orders {
    /// How many times the route ran.
    pub fn made(&self) -> u64 {
        self.made.load(Ordering::SeqCst)
    }
}

/// Makes an order; runs once per key, whatever the client retries.
async fn create_order(State(orders): State<Orders>, body: String) -> impl IntoResponse {
    let order_id = orders.made.fetch_add(1, Ordering::SeqCst) + 1;
    let order = format!(r#"{{"order_id":{order_id},"request_bytes":{}}}"#, body.len());
    (
        StatusCode::CREATED,
        [
            (header::CONTENT_TYPE, "application/json".to_owned()),
            (header::LOCATION, format!("/orders/{order_id}")),
        ],
        order,
    )
}

/// The application: `POST /orders` wearing the idempotency layer over
/// `store`. One caller for everyone here; an application with
/// authentication names the caller with its own `CallerIdentity`.
pub fn app(store: Arc<dyn IdempotencyStore>, orders: Orders) -> Router {
    let caller = SingleCaller(CallerId::new("example").expect("a valid caller id"));
    let idempotency = Idempotency::builder(store, caller).build();
    let idempotent = IdempotencyLayer::new(idempotency, ORDER_BODY_BYTES_MAX);
    Router::new()
        .route("/orders", post(create_order.layer(idempotent)))
        .with_state(orders)
}

/// The embedded store in a fresh temporary directory, deleted on exit.
pub fn open_store() -> Result<Arc<dyn IdempotencyStore>, store_core::StoreError> {
    let store = EmbeddedStore::open_embedded(&EmbeddedConfig::temporary(), Policy::default())?;
    Ok(Arc::new(store))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let address = std::env::args()
        .nth(1)
        .unwrap_or_else(|| LISTEN_ADDRESS_DEFAULT.to_owned());
    let router = app(open_store()?, Orders::default());
    let listener = tokio::net::TcpListener::bind(&address).await?;
    println!(
        "POST http://{}/orders with an Idempotency-Key header",
        listener.local_addr()?
    );
    axum::serve(listener, router).await?;
    Ok(())
}
