//! Crashes at every step of a create.
//!
//! The real `server` binary (built with failpoints) runs against a carrier
//! simulator in a process of its own, which outlives every crash. Each
//! iteration starts the server with one failpoint, chosen at random from a
//! seeded generator, set to `return`: the first request that reaches it
//! parks there and the process says so; the harness then reads /metrics and
//! kills the process with SIGKILL, mid-step. The next iteration restarts it
//! on the same data directory, Redis or database, and the Fulfilment client
//! keeps retrying each parcel with its derived key until it gets a final
//! answer. At the end a process without failpoints finishes every parcel.
//!
//! Figures per backend: parcels with a final label (all), parcels with more
//! than one label (0), carrier purchases above one per parcel (0), repeats
//! the carrier deduplicated, and how many retries reached the label store's
//! uniqueness (the second line of defence; only Redis, whose label and
//! record commit separately, may reach it).
//!
//! `IDEM_CRASHES` sets the crashes per backend (CI default 30; 50 on
//! FoundationDB, whose suites run apart, in scripts/test-foundationdb).

use crate::support::audit::{LabelCensus, census_postgres, open_embedded_at};
use crate::support::backends::{BackendSetup, pair};
use crate::support::process::{ServerProcess, start_carrier, start_server};
use crate::support::{
    ALICE_ID, LabelPost, Reply, callers_env, client, derived_key, label_body, metric_value, metrics_text, scaled, seed,
    unique_order_id,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use server::backend::StoreKind;
use server::carrier::{CarrierStats, read_stats};
use server::failpoints;
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// Crashes per backend when `IDEM_CRASHES` is not set.
pub const CRASHES_CI_DEFAULT: usize = 30;
/// Crashes on FoundationDB when `IDEM_CRASHES` is not set.
#[cfg(feature = "foundationdb")]
pub const CRASHES_FOUNDATIONDB_CI_DEFAULT: usize = 50;

fn crashes_ci_default(backend: StoreKind) -> usize {
    match backend {
        #[cfg(feature = "foundationdb")]
        StoreKind::Foundationdb => CRASHES_FOUNDATIONDB_CI_DEFAULT,
        _ => CRASHES_CI_DEFAULT,
    }
}
/// A short lease, so a retry takes a crashed attempt's key over quickly.
const LEASE_MS: u64 = 600;
/// Must stay under the lease (the config refuses otherwise).
const CARRIER_TIMEOUT_MS: u64 = 300;
/// Most times a process passes its failpoint before it crashes there.
const PASSES_BEFORE_CRASH_MAX: u32 = 3;
/// Pause between two attempts of one parcel after a 409 or 503.
const RETRY_PAUSE_MS: u64 = 40;
/// Attempts one server process may serve without reaching its failpoint.
const ATTEMPTS_PER_PROCESS_MAX: usize = 200;
/// Longest the final, failpoint-free process may take to finish every parcel.
const FINISH_MS_MAX: u64 = 60_000;

/// One intent of the Fulfilment service.
struct Parcel {
    order_id: u64,
    key: String,
    body: String,
    attempts: usize,
    /// The first final answer (a 201).
    answer: Option<Reply>,
}

impl Parcel {
    fn new() -> Self {
        let order_id = unique_order_id();
        Self {
            order_id,
            key: derived_key(order_id, 1),
            body: label_body(order_id, 1),
            attempts: 0,
            answer: None,
        }
    }
}

/// What one run measured.
#[derive(Debug, Default)]
struct CrashFigures {
    crashes: usize,
    crashes_by_point: BTreeMap<String, usize>,
    parcels: usize,
    parcels_with_final_label: usize,
    parcels_with_more_than_one_label: usize,
    purchases_above_one: u64,
    carrier_deduplicated: u64,
    retries_reaching_label_uniqueness: f64,
    takeovers: f64,
    attempts: usize,
}

/// Drives one process until its failpoint parks a request (then kills it)
/// or, with `finish`, until every parcel has its answer.
struct Driver {
    http: reqwest::Client,
    pending: VecDeque<Parcel>,
    done: Vec<Parcel>,
    figures: CrashFigures,
    /// What happened lately (crashes, answers), shown when a test fails.
    history: VecDeque<String>,
}

/// Events kept in the history.
const HISTORY_MAX: usize = 12;

enum Attempt {
    Answered(Reply),
    Crashed(String),
}

impl Driver {
    /// One attempt of the front parcel, raced against the process's failpoint.
    async fn attempt(&mut self, process: &mut ServerProcess) -> Attempt {
        let parcel = self.pending.front_mut().expect("a parcel to drive");
        parcel.attempts += 1;
        self.figures.attempts += 1;
        let post = LabelPost::new(&parcel.key, &parcel.body);
        let url = process.url.clone();
        let sent = post.send(&self.http, &url);
        tokio::select! {
            reply = sent => Attempt::Answered(reply.expect("the server answers while it is not killed")),
            Some(point) = process.wait_for_marked_line(Duration::from_secs(3600)) => Attempt::Crashed(point),
        }
    }

    /// Files the answer: a 201 finishes the parcel; 409 and 503 are retried.
    async fn file(&mut self, reply: Reply, process: &ServerProcess) {
        let order_id = self.pending.front().map_or(0, |parcel| parcel.order_id);
        if reply.status != 409 {
            self.remember(format!("order {order_id}: {} {}", reply.status, reply.code()));
        }
        match reply.status {
            201 => {
                let mut parcel = self.pending.pop_front().expect("the driven parcel");
                parcel.answer = Some(reply);
                self.done.push(parcel);
            }
            409 | 503 => tokio::time::sleep(Duration::from_millis(RETRY_PAUSE_MS)).await,
            status => panic!(
                "a retryable intent got {status}: {}\nlately: {:#?}\nthe server's log:\n{}",
                reply.text(),
                self.history,
                process.log()
            ),
        }
    }

    /// Serves `process` until its failpoint fires, then kills it there.
    async fn crash_one(&mut self, mut process: ServerProcess) {
        for _ in 0..ATTEMPTS_PER_PROCESS_MAX {
            if self.pending.is_empty() {
                self.pending.push_back(Parcel::new());
                self.figures.parcels += 1;
            }
            match self.attempt(&mut process).await {
                Attempt::Answered(reply) => self.file(reply, &process).await,
                Attempt::Crashed(point) => {
                    let order_id = self.pending.front().map_or(0, |parcel| parcel.order_id);
                    self.remember(format!("order {order_id}: crashed at {point}"));
                    self.read_counters(&process).await;
                    process.kill().await;
                    self.figures.crashes += 1;
                    *self.figures.crashes_by_point.entry(point).or_default() += 1;
                    return;
                }
            }
        }
        panic!(
            "no failpoint fired in {ATTEMPTS_PER_PROCESS_MAX} attempts; log:\n{}",
            process.log()
        );
    }

    fn remember(&mut self, event: String) {
        if self.history.len() == HISTORY_MAX {
            self.history.pop_front();
        }
        self.history.push_back(event);
    }

    /// Counters of a process, read just before it dies (it serves nothing else meanwhile).
    async fn read_counters(&mut self, process: &ServerProcess) {
        let metrics = metrics_text(&self.http, &process.url).await;
        self.figures.retries_reaching_label_uniqueness += metric_value(&metrics, "idem_labels_existing_total", &[]);
        self.figures.takeovers += metric_value(&metrics, "idem_lease_takeovers_total", &[]);
    }

    /// Drives every pending parcel to its answer on a process without failpoints.
    async fn finish(&mut self, mut process: ServerProcess) {
        let deadline = Instant::now() + Duration::from_millis(FINISH_MS_MAX);
        while !self.pending.is_empty() {
            assert!(
                Instant::now() < deadline,
                "parcels left without an answer: {}",
                self.pending.len()
            );
            match self.attempt(&mut process).await {
                Attempt::Answered(reply) => self.file(reply, &process).await,
                Attempt::Crashed(point) => panic!("the final process has no failpoints, yet {point} fired"),
            }
        }
        // Every answer replays byte for byte.
        for parcel in &self.done {
            let replay = LabelPost::new(&parcel.key, &parcel.body)
                .send(&self.http, &process.url)
                .await
                .expect("replay");
            let first = parcel.answer.as_ref().expect("answered");
            assert_eq!((replay.status, replay.is_replay()), (201, true), "{}", replay.text());
            assert_eq!(replay.body, first.body, "the replay differs from the answer given");
        }
        self.read_counters(&process).await;
        let status = process.terminate().await.0;
        assert!(status.success(), "the last process stops cleanly");
    }
}

fn server_env(setup: &BackendSetup, carrier_url: &str) -> Vec<(String, String)> {
    let mut env = setup.env();
    env.extend([
        pair("IDEM__SERVER__LISTEN", "127.0.0.1:0"),
        pair("IDEM__CALLERS", callers_env()),
        pair("IDEM__POLICY__LEASE_MS", LEASE_MS),
        pair("IDEM__CARRIER__TIMEOUT_MS", CARRIER_TIMEOUT_MS),
        pair("IDEM__CARRIER__URL", carrier_url),
    ]);
    env
}

async fn carrier_stats(http: &reqwest::Client, carrier_url: &str) -> CarrierStats {
    read_stats(http, carrier_url).await.expect("carrier stats")
}

async fn census(setup: &BackendSetup) -> LabelCensus {
    match setup.backend {
        StoreKind::Postgres => census_postgres(setup.postgres_url.as_deref().expect("url")).await,
        StoreKind::Embedded | StoreKind::Redis => {
            let store = open_embedded_at(&setup.embedded_path());
            crate::support::audit::census_embedded(&store).await
        }
        #[cfg(feature = "foundationdb")]
        StoreKind::Foundationdb => {
            let store = crate::support::backends::open_foundationdb(setup, store_core::Policy::default()).await;
            crate::support::audit::census_embedded(store.as_ref()).await
        }
        other => panic!("the crash tests do not run on {other}"),
    }
}

async fn crash_run(backend: StoreKind) {
    let crashes = scaled("IDEM_CRASHES", crashes_ci_default(backend));
    let mut rng = StdRng::seed_from_u64(seed(&format!("crash_{}", backend.name())));
    let setup = BackendSetup::start(backend).await;
    let carrier = start_carrier((0, 2), 0.0, setup.data.path()).await;
    let env = server_env(&setup, &carrier.url);
    let mut driver = Driver {
        http: client(),
        pending: VecDeque::new(),
        done: Vec::new(),
        figures: CrashFigures::default(),
        history: VecDeque::new(),
    };
    let started = Instant::now();
    for _ in 0..crashes {
        let point = failpoints::ALL[rng.random_range(0..failpoints::ALL.len())];
        // Passing the point a few times first spreads the crashes over new
        // parcels as well as over the recovery of the crashed one.
        let passes = rng.random_range(0..=PASSES_BEFORE_CRASH_MAX);
        let failpoints_setting = format!("{point}={passes}*off->return");
        let process = start_server(&[], &env, Some(&failpoints_setting), setup.data.path()).await;
        driver.crash_one(process).await;
    }
    driver
        .finish(start_server(&[], &env, None, setup.data.path()).await)
        .await;
    let stats = carrier_stats(&driver.http, &carrier.url).await;
    let _ = carrier.terminate().await.0;
    let census = census(&setup).await;
    judge(backend, &mut driver, &stats, &census, started.elapsed());
}

fn judge(backend: StoreKind, driver: &mut Driver, stats: &CarrierStats, census: &LabelCensus, took: Duration) {
    let figures = &mut driver.figures;
    for parcel in &driver.done {
        let answered = parcel.answer.as_ref().expect("answered").label_id();
        let stored = census.labels_of(ALICE_ID, parcel.order_id, 1);
        if stored == [answered] {
            figures.parcels_with_final_label += 1;
        }
    }
    figures.parcels_with_more_than_one_label = census.parcels_with_more_than_one_label();
    figures.purchases_above_one = stats
        .purchases_by_parcel
        .iter()
        .map(|parcel| parcel.purchases.saturating_sub(1))
        .sum();
    figures.carrier_deduplicated = stats.deduplicated_repeats;
    eprintln!(
        "RELIABILITY crash backend={} took_s={:.1} {figures:?}",
        backend.name(),
        took.as_secs_f64()
    );
    assert_eq!(figures.crashes, scaled("IDEM_CRASHES", crashes_ci_default(backend)));
    assert_eq!(figures.parcels, driver.done.len(), "every parcel got a final answer");
    assert_eq!(
        figures.parcels_with_final_label, figures.parcels,
        "every answer names the parcel's one stored label"
    );
    assert_eq!(figures.parcels_with_more_than_one_label, 0);
    assert_eq!(
        census.labels_total(),
        figures.parcels,
        "no label for a parcel nobody asked for"
    );
    let bought_twice: Vec<_> = stats
        .purchases_by_parcel
        .iter()
        .filter(|parcel| parcel.purchases > 1)
        .collect();
    assert_eq!(
        figures.purchases_above_one, 0,
        "parcels bought more than once: {bought_twice:?}"
    );
    assert_eq!(
        stats.purchases_total as usize, figures.parcels,
        "one purchase per parcel"
    );
    if backend != StoreKind::Redis {
        // The label and the record commit together, so no crash can leave a
        // label without its record for a retry to find.
        assert_eq!(figures.retries_reaching_label_uniqueness, 0.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashes_at_every_step_lose_nothing_and_buy_nothing_twice_embedded() {
    crash_run(StoreKind::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashes_at_every_step_lose_nothing_and_buy_nothing_twice_redis() {
    crash_run(StoreKind::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashes_at_every_step_lose_nothing_and_buy_nothing_twice_postgres() {
    crash_run(StoreKind::Postgres).await;
}

#[cfg(feature = "foundationdb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashes_at_every_step_lose_nothing_and_buy_nothing_twice_foundationdb() {
    crash_run(StoreKind::Foundationdb).await;
}
