//! A carrier to run against: sells labels at `POST /carrier/v1/labels`
//! with its own idempotency (a sale book in memory), and counts every
//! purchase so an audit can prove no label was bought twice.
//!
//! Each sale takes its latency after the key is claimed, so a repeat that
//! arrives meanwhile gets 409. Faults follow the config (latency distribution, error rate,
//! lost-reply rate), or a script of steps that a test queues at
//! `POST /carrier/v1/script`. A lost reply is a purchase that commits and
//! then the connection closes without an answer, which is why the simulator
//! serves HTTP with hyper directly: an axum handler cannot drop a connection.
//!
//! A purchase and the answer saved for its key are written under one lock
//! ([`SaleBook`]), so the counts in `GET /carrier/v1/stats` are exactly
//! what was bought. The book lives in memory, as befits a test double: a
//! sale costs no commit, so the simulator does not take the CPU the
//! service under test needs (it took 0.29 ms per intent on its own embedded
//! store; BENCHMARKS.md, "The carrier simulator's CPU"). It forgets
//! everything when it stops.

use super::{CARRIER_LABELS_PATH, CARRIER_SCRIPT_PATH, CARRIER_STATS_PATH, CarrierLabel, CarrierLabelRequest};
use crate::carrier::config::SimulatorConfig;
use crate::labels::ShippingService;
use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hyper_util::rt::TokioIo;
use idem_http::key_header::idempotency_key;
use idem_http::saved::response_from_saved;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::BuildHasher;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use store_core::{Fingerprint, SavedResponse};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// Most steps a script may queue.
pub const SCRIPT_STEPS_MAX: usize = 10_000;
/// Most purchases the simulator makes; past it, calls are answered 503
/// (about eight minutes at 2,000 new labels per second).
pub const PURCHASES_MAX: usize = 1_000_000;
/// `Retry-After` of a 409 for a key whose sale is in progress: sales take
/// milliseconds.
pub const IN_PROGRESS_RETRY_AFTER_S: u64 = 1;
/// Largest request body the simulator reads, in bytes.
pub const SIMULATOR_BODY_BYTES_MAX: usize = 64 * 1024;

/// A fault the simulator injects into one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SimulatedFault {
    #[default]
    None,
    /// Answer 503 before buying anything.
    Error,
    /// Buy, then close the connection without an answer.
    LostReply,
}

/// What the simulator does with one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct ScriptStep {
    pub delay_ms: u64,
    pub fault: SimulatedFault,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Script {
    steps: Vec<ScriptStep>,
}

/// Purchases of one parcel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParcelPurchases {
    pub order_id: u64,
    pub parcel_no: u32,
    pub label_version: u32,
    pub purchases: u64,
}

/// The audit: what was bought, and how many repeats were deduplicated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CarrierStats {
    pub requests_total: u64,
    pub purchases_total: u64,
    pub deduplicated_repeats: u64,
    pub in_progress_answers: u64,
    pub errors_injected: u64,
    pub replies_dropped: u64,
    pub purchases_by_carrier_key: BTreeMap<String, u64>,
    pub purchases_by_parcel: Vec<ParcelPurchases>,
}

/// One purchase.
#[derive(Debug, Clone)]
struct Purchase {
    carrier_key: String,
    order_id: u64,
    parcel_no: u32,
    label_version: u32,
}

/// Maps the sales are split over. One map of every sale grows by
/// rehashing all of it at once, on the simulator's one thread: at 2,000
/// sales/s that happens at the same moments as the bench's intent log
/// (`bench/src/http_mode/client.rs`), whose growth stalls showed as latency
/// spikes. Split, each map grows in steps a sixty-fourth of the size.
const SALE_SHARDS: usize = 64;

/// The carrier's idempotency records and its purchases, under one lock.
struct SaleBook {
    sales: Vec<HashMap<String, Sale>>,
    /// Which of `sales` holds a key.
    shard_hasher: RandomState,
    /// Reserved for [`PURCHASES_MAX`] at once, so that it never moves
    /// while it grows (the reservation is address space; only the pages
    /// written are memory).
    purchases: Vec<Purchase>,
}

impl Default for SaleBook {
    fn default() -> Self {
        Self {
            sales: (0..SALE_SHARDS).map(|_| HashMap::new()).collect(),
            shard_hasher: RandomState::new(),
            purchases: Vec::with_capacity(PURCHASES_MAX),
        }
    }
}

/// The record of one carrier key.
enum Sale {
    /// A call holds the key and is selling.
    InProgress { fingerprint: Fingerprint },
    /// Sold: every repeat with the same body gets this answer.
    Sold {
        fingerprint: Fingerprint,
        answer: SavedResponse,
    },
}

/// What a call finds when it claims its key.
enum SaleClaim {
    Acquired,
    Replay(SavedResponse),
    InProgress,
    Mismatch,
}

impl SaleBook {
    fn sales_of(&mut self, carrier_key: &str) -> &mut HashMap<String, Sale> {
        let shard = self.shard_hasher.hash_one(carrier_key) as usize % SALE_SHARDS;
        &mut self.sales[shard]
    }

    fn claim(&mut self, carrier_key: &str, fingerprint: Fingerprint) -> SaleClaim {
        let sales = self.sales_of(carrier_key);
        match sales.get(carrier_key) {
            None => {
                sales.insert(carrier_key.to_owned(), Sale::InProgress { fingerprint });
                SaleClaim::Acquired
            }
            Some(Sale::InProgress { fingerprint: held } | Sale::Sold { fingerprint: held, .. })
                if *held != fingerprint =>
            {
                SaleClaim::Mismatch
            }
            Some(Sale::InProgress { .. }) => SaleClaim::InProgress,
            Some(Sale::Sold { answer, .. }) => SaleClaim::Replay(answer.clone()),
        }
    }

    /// The claiming call sold nothing (an injected error, a bad body): the
    /// key is free again.
    fn unclaim(&mut self, carrier_key: &str) {
        let sales = self.sales_of(carrier_key);
        if let Some(Sale::InProgress { .. }) = sales.get(carrier_key) {
            sales.remove(carrier_key);
        }
    }

    /// Records the purchase and the answer together, or (with the reason)
    /// nothing at all.
    fn sell(&mut self, purchase: Purchase, answer: SavedResponse) -> Result<(), &'static str> {
        let Some(Sale::InProgress { fingerprint }) = self.sales_of(&purchase.carrier_key).get(&purchase.carrier_key)
        else {
            // Only the call that claimed the key sells, and nothing else
            // ends its claim meanwhile.
            return Err("the sale's claim is gone");
        };
        let fingerprint = *fingerprint;
        if self.purchases.len() >= PURCHASES_MAX {
            self.unclaim(&purchase.carrier_key);
            return Err("the simulator made as many purchases as it can hold");
        }
        self.sales_of(&purchase.carrier_key)
            .insert(purchase.carrier_key.clone(), Sale::Sold { fingerprint, answer });
        self.purchases.push(purchase);
        Ok(())
    }
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    deduplicated_repeats: AtomicU64,
    in_progress_answers: AtomicU64,
    errors_injected: AtomicU64,
    replies_dropped: AtomicU64,
}

struct Simulator {
    book: Mutex<SaleBook>,
    config: SimulatorConfig,
    rng: Mutex<StdRng>,
    script: Mutex<VecDeque<ScriptStep>>,
    counters: Counters,
}

/// Marks a response the connection must drop instead of sending.
#[derive(Debug, Clone, Copy)]
struct DropReply;

#[derive(Debug, thiserror::Error)]
#[error("the simulated carrier dropped its reply")]
struct ReplyDropped;

/// A running simulator. Stop it with [`CarrierServer::stop`].
pub struct CarrierServer {
    addr: SocketAddr,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl CarrierServer {
    /// Serves on `listener` until stopped.
    pub async fn start(config: &SimulatorConfig, listener: TcpListener) -> std::io::Result<Self> {
        let simulator = Arc::new(Simulator::new(config));
        let addr = listener.local_addr()?;
        let stop = CancellationToken::new();
        let router = axum::Router::new()
            .route(CARRIER_LABELS_PATH, post(sell_label))
            .route(CARRIER_STATS_PATH, get(stats))
            .route(CARRIER_SCRIPT_PATH, post(queue_script))
            .layer(axum::extract::DefaultBodyLimit::max(SIMULATOR_BODY_BYTES_MAX))
            .with_state(simulator);
        let task = tokio::spawn(serve(listener, router, stop.clone()));
        Ok(Self { addr, stop, task })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting connections; connections in progress are dropped.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// Accepts connections until `stop`; each is served by hyper's HTTP/1
/// connection, whose service may fail a request to drop the reply.
async fn serve(listener: TcpListener, router: axum::Router, stop: CancellationToken) {
    let connections = tokio_util::task::TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stop.cancelled() => break,
        };
        let Ok((stream, _peer)) = accepted else {
            // Out of file descriptors or similar: pause instead of spinning.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let router = router.clone();
        let service = hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            let router = router.clone();
            async move {
                let response = match router.oneshot(request.map(Body::new)).await {
                    Ok(response) => response,
                    Err(never) => match never {},
                };
                match response.extensions().get::<DropReply>() {
                    Some(DropReply) => Err(ReplyDropped),
                    None => Ok(response),
                }
            }
        });
        let stop = stop.clone();
        connections.spawn(async move {
            let connection = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = connection => {}
                () = stop.cancelled() => {}
            }
        });
    }
    connections.close();
    connections.wait().await;
}

impl Simulator {
    fn new(config: &SimulatorConfig) -> Self {
        let seed = if config.seed == 0 { rand::random() } else { config.seed };
        Self {
            book: Mutex::new(SaleBook::default()),
            config: config.clone(),
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            script: Mutex::new(VecDeque::new()),
            counters: Counters::default(),
        }
    }

    fn book(&self) -> std::sync::MutexGuard<'_, SaleBook> {
        // Every change to the book is one statement under the lock, so a
        // poisoned lock still guards a consistent book.
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next scripted step, or one drawn from the configured distribution.
    fn next_step(&self) -> ScriptStep {
        if let Some(step) = self.script.lock().unwrap_or_else(|p| p.into_inner()).pop_front() {
            return step;
        }
        let config = &self.config;
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        let delay_ms = if config.slow_rate > 0.0 && rng.random_bool(config.slow_rate) {
            config.slow_ms
        } else {
            rng.random_range(config.latency_ms_min..=config.latency_ms_max)
        };
        let fault = if config.error_rate > 0.0 && rng.random_bool(config.error_rate) {
            SimulatedFault::Error
        } else if config.lost_reply_rate > 0.0 && rng.random_bool(config.lost_reply_rate) {
            SimulatedFault::LostReply
        } else {
            SimulatedFault::None
        };
        ScriptStep { delay_ms, fault }
    }

    fn random_digits(&self, modulus: u64) -> u64 {
        self.rng
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .random_range(0..modulus)
    }
}

fn carrier_problem(status: StatusCode, detail: &str) -> Response {
    let body = serde_json::json!({ "status": status.as_u16(), "detail": detail });
    let mut response = (status, Json(body)).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    response
}

/// `POST /carrier/v1/labels`.
async fn sell_label(State(simulator): State<Arc<Simulator>>, headers: HeaderMap, body: Bytes) -> Response {
    simulator.counters.requests.fetch_add(1, Ordering::Relaxed);
    let step = simulator.next_step();
    let key = match idempotency_key(&headers) {
        Ok(key) => key,
        Err(error) => return carrier_problem(StatusCode::BAD_REQUEST, &error.to_string()),
    };
    // The claim and the sale run in a task of their own, like a real
    // carrier's: a caller that hangs up (or is killed) mid-call stops
    // neither, so no claim is left started without its sale.
    let work = tokio::spawn(claim_and_sell(simulator.clone(), key, body, step));
    let mut response = match work.await {
        Ok(response) => response,
        Err(error) => carrier_problem(StatusCode::INTERNAL_SERVER_ERROR, &format!("sale failed: {error}")),
    };
    if step.fault == SimulatedFault::LostReply && response.status().is_success() {
        simulator.counters.replies_dropped.fetch_add(1, Ordering::Relaxed);
        response.extensions_mut().insert(DropReply);
    }
    response
}

/// Claims the key and, when it is this call's, sells.
async fn claim_and_sell(
    simulator: Arc<Simulator>,
    key: store_core::IdempotencyKey,
    body: Bytes,
    step: ScriptStep,
) -> Response {
    let fingerprint = Fingerprint::of_request("POST", CARRIER_LABELS_PATH, &body);
    let claim = simulator.book().claim(key.as_str(), fingerprint);
    match claim {
        SaleClaim::Acquired => {
            tokio::time::sleep(Duration::from_millis(step.delay_ms)).await;
            sell_once(&simulator, key.as_str(), &body, step.fault)
        }
        SaleClaim::Replay(saved) => {
            simulator.counters.deduplicated_repeats.fetch_add(1, Ordering::Relaxed);
            response_from_saved(&saved, true)
        }
        SaleClaim::InProgress => {
            simulator.counters.in_progress_answers.fetch_add(1, Ordering::Relaxed);
            let mut response = carrier_problem(StatusCode::CONFLICT, "a call with this key is in progress");
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(IN_PROGRESS_RETRY_AFTER_S));
            response
        }
        SaleClaim::Mismatch => carrier_problem(StatusCode::UNPROCESSABLE_ENTITY, "key reused with another body"),
    }
}

/// A claimed call: fail (injected), refuse (bad body) or buy.
fn sell_once(simulator: &Simulator, carrier_key: &str, body: &[u8], fault: SimulatedFault) -> Response {
    if fault == SimulatedFault::Error {
        simulator.counters.errors_injected.fetch_add(1, Ordering::Relaxed);
        simulator.book().unclaim(carrier_key);
        return carrier_problem(StatusCode::SERVICE_UNAVAILABLE, "injected carrier error");
    }
    let request: CarrierLabelRequest = match serde_json::from_slice(body) {
        Ok(request) => request,
        Err(error) => {
            simulator.book().unclaim(carrier_key);
            return carrier_problem(StatusCode::BAD_REQUEST, &format!("body: {error}"));
        }
    };
    let label = make_label(simulator, &request);
    let answer = match label_answer(&label) {
        Ok(answer) => answer,
        Err(detail) => {
            simulator.book().unclaim(carrier_key);
            return carrier_problem(StatusCode::INTERNAL_SERVER_ERROR, &detail);
        }
    };
    let purchase = Purchase {
        carrier_key: carrier_key.to_owned(),
        order_id: request.order_id,
        parcel_no: request.parcel_no,
        label_version: request.label_version,
    };
    match simulator.book().sell(purchase, answer.clone()) {
        Ok(()) => response_from_saved(&answer, false),
        Err(detail) => carrier_problem(StatusCode::SERVICE_UNAVAILABLE, detail),
    }
}

fn make_label(simulator: &Simulator, request: &CarrierLabelRequest) -> CarrierLabel {
    let (prefix, base_cents, cents_per_kg) = match request.service {
        ShippingService::Ground => ("GRD", 450, 40),
        ShippingService::Express => ("EXP", 1_200, 95),
    };
    let kilograms = u64::from(request.weight_g).div_ceil(1_000);
    CarrierLabel {
        carrier_label_id: format!("lbl_{:016x}", simulator.random_digits(u64::MAX)),
        tracking_no: format!(
            "{prefix}{:09}{:03}{:06}",
            request.order_id % 1_000_000_000,
            request.parcel_no % 1_000,
            simulator.random_digits(1_000_000)
        ),
        cost_cents: base_cents + cents_per_kg * kilograms,
        order_id: request.order_id,
        parcel_no: request.parcel_no,
        label_version: request.label_version,
        service: request.service,
        weight_g: request.weight_g,
    }
}

/// The 201 a sale answers, and every repeat of it.
fn label_answer(label: &CarrierLabel) -> Result<SavedResponse, String> {
    let body = serde_json::to_vec(label).map_err(|error| format!("carrier label: {error}"))?;
    SavedResponse::new(201, vec![("content-type".into(), "application/json".into())], body)
        .map_err(|error| format!("carrier label: {error}"))
}

/// `GET /carrier/v1/stats`.
async fn stats(State(simulator): State<Arc<Simulator>>) -> Response {
    Json(read_stats(&simulator)).into_response()
}

fn read_stats(simulator: &Simulator) -> CarrierStats {
    let mut by_key: BTreeMap<String, u64> = BTreeMap::new();
    let mut by_parcel: BTreeMap<(u64, u32, u32), u64> = BTreeMap::new();
    let purchases_total = {
        let book = simulator.book();
        for purchase in &book.purchases {
            *by_key.entry(purchase.carrier_key.clone()).or_default() += 1;
            *by_parcel
                .entry((purchase.order_id, purchase.parcel_no, purchase.label_version))
                .or_default() += 1;
        }
        book.purchases.len() as u64
    };
    let counters = &simulator.counters;
    CarrierStats {
        requests_total: counters.requests.load(Ordering::Relaxed),
        purchases_total,
        deduplicated_repeats: counters.deduplicated_repeats.load(Ordering::Relaxed),
        in_progress_answers: counters.in_progress_answers.load(Ordering::Relaxed),
        errors_injected: counters.errors_injected.load(Ordering::Relaxed),
        replies_dropped: counters.replies_dropped.load(Ordering::Relaxed),
        purchases_by_carrier_key: by_key,
        purchases_by_parcel: by_parcel
            .into_iter()
            .map(|((order_id, parcel_no, label_version), purchases)| ParcelPurchases {
                order_id,
                parcel_no,
                label_version,
                purchases,
            })
            .collect(),
    }
}

/// `POST /carrier/v1/script`: queue steps for the next calls, in order.
async fn queue_script(State(simulator): State<Arc<Simulator>>, body: Bytes) -> Response {
    let script: Script = match serde_json::from_slice(&body) {
        Ok(script) => script,
        Err(error) => return carrier_problem(StatusCode::BAD_REQUEST, &format!("script: {error}")),
    };
    let mut queue = simulator.script.lock().unwrap_or_else(|p| p.into_inner());
    if queue.len() + script.steps.len() > SCRIPT_STEPS_MAX {
        return carrier_problem(StatusCode::BAD_REQUEST, "too many queued steps");
    }
    queue.extend(script.steps);
    StatusCode::NO_CONTENT.into_response()
}
