//! The same application as `embedded.rs`, `POST /orders`, with its
//! idempotency records in PostgreSQL (store-postgres).
//!
//! ```text
//! IDEM_EXAMPLE_POSTGRES_URL=postgres://idem@127.0.0.1:5432/idem \
//!     cargo run -p idem-http --example postgres       # serves on 127.0.0.1:3000
//! cargo run -p idem-http --example postgres -- postgres://idem@127.0.0.1:5432/idem 127.0.0.1:3001
//! ```
//!
//! The store's migrations (its `idempotency_keys` and
//! `idempotency_tombstones` tables) run at startup, under an advisory lock,
//! so several instances may start at once. [`app`] builds the router, so
//! `idem-http/tests/examples.rs` calls it with `tower::ServiceExt::oneshot`
//! against a throw-away PostgreSQL server.

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
use store_postgres::{PostgresConfig, PostgresStore};

/// The variable naming the database when no URL is given as the first argument.
pub const URL_VARIABLE: &str = "IDEM_EXAMPLE_POSTGRES_URL";
/// Largest order body the route reads; larger ones get 413.
pub const ORDER_BODY_BYTES_MAX: usize = 16 * 1024;
/// Where the example listens unless an address is given as its second argument.
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

/// The application: `POST /orders` wearing the idempotency layer over `store`.
pub fn app(store: Arc<dyn IdempotencyStore>, orders: Orders) -> Router {
    let caller = SingleCaller(CallerId::new("example").expect("a valid caller id"));
    let idempotency = Idempotency::builder(store, caller).build();
    let idempotent = IdempotencyLayer::new(idempotency, ORDER_BODY_BYTES_MAX);
    Router::new()
        .route("/orders", post(create_order.layer(idempotent)))
        .with_state(orders)
}

/// The store on the database at `url`, its migrations applied.
pub async fn open_store(url: &str) -> Result<Arc<dyn IdempotencyStore>, Box<dyn std::error::Error>> {
    let store = PostgresStore::new(&PostgresConfig::new(url), Policy::default())?;
    store.migrate(&[]).await?;
    Ok(Arc::new(store))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut arguments = std::env::args().skip(1);
    let url = match arguments.next().or_else(|| std::env::var(URL_VARIABLE).ok()) {
        Some(url) => url,
        None => return Err(format!("give a PostgreSQL URL as the first argument or in {URL_VARIABLE}").into()),
    };
    let address = arguments.next().unwrap_or_else(|| LISTEN_ADDRESS_DEFAULT.to_owned());
    let router = app(open_store(&url).await?, Orders::default());
    let listener = tokio::net::TcpListener::bind(&address).await?;
    println!(
        "POST http://{}/orders with an Idempotency-Key header",
        listener.local_addr()?
    );
    axum::serve(listener, router).await?;
    Ok(())
}
