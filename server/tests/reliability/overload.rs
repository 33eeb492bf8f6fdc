//! Overload.
//!
//! The real `server` binary with an in-flight cap of 32, a carrier process
//! that takes 50 ms per label. First 32 closed-loop clients (the cap) for
//! the baseline; then 320 (ten times the cap). Excess requests must be shed
//! at once with 503 `overloaded` and `Retry-After`, the process's resident
//! memory (VmRSS from /proc) must stay under a stated bound, and the rate of
//! admitted creates must hold near the baseline.

use crate::support::backends::{BackendSetup, pair};
use crate::support::process::{ServerProcess, start_carrier, start_server};
use crate::support::{LabelPost, callers_env, derived_key, label_body, unique_order_id};
use server::backend::StoreKind;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The server's in-flight cap in this test.
const IN_FLIGHT_MAX: usize = 32;
/// Offered concurrency: ten times the cap.
const OVERLOAD_FACTOR: usize = 10;
/// The carrier's time per label, so each admitted create holds its slot.
const CARRIER_LATENCY_MS: u64 = 50;
/// Length of each measured phase.
const PHASE_MS: u64 = 3_000;
/// A shed client waits this long before trying again: half the 1 s
/// Retry-After, so the excess keeps pressing. (With 10 ms pauses the 288
/// excess clients, debug builds on the same 2 cores as the server, take the
/// CPU themselves: admitted creates then fell from 460/s to 188/s.)
const SHED_PAUSE_MS: u64 = 500;
/// The stated bound on the server's resident memory under overload.
pub const RESIDENT_MIB_MAX: u64 = 256;
/// Shed answers must come back this fast (99th percentile, as the client
/// sees it: the load generator shares the server's 2 cores, and in CI other
/// test binaries run beside it, so this is mostly CPU queueing, not the
/// shedding itself; RELIABILITY.md reports the figures measured).
const SHED_P99_MS_MAX: u128 = 1_000;
/// Admitted throughput under overload, as a share of the baseline, at least.
/// Loose for the same reason: measured 0.66 to 0.9 on a busy 2-core machine.
/// (Removing the shedding still fails this test: nothing is shed at all.)
const THROUGHPUT_HELD_SHARE_MIN: f64 = 0.5;

#[derive(Default)]
struct Phase {
    admitted: AtomicU64,
    shed: AtomicU64,
    other: Mutex<Vec<String>>,
    shed_latencies_ms: Mutex<Vec<u128>>,
}

/// One closed-loop client: a new parcel per create, until `stop`.
async fn client_loop(http: reqwest::Client, base: String, phase: &Phase, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        let order_id = unique_order_id();
        let (key, body) = (derived_key(order_id, 1), label_body(order_id, 1));
        let started = Instant::now();
        let Ok(reply) = LabelPost::new(&key, &body).send(&http, &base).await else {
            phase.other.lock().expect("lock").push("transport error".into());
            continue;
        };
        match (reply.status, reply.code().as_str()) {
            (201, _) => {
                phase.admitted.fetch_add(1, Ordering::Relaxed);
            }
            (503, "overloaded") => {
                assert!(reply.retry_after().is_some_and(|seconds| seconds >= 1));
                phase.shed.fetch_add(1, Ordering::Relaxed);
                phase
                    .shed_latencies_ms
                    .lock()
                    .expect("lock")
                    .push(started.elapsed().as_millis());
                tokio::time::sleep(Duration::from_millis(SHED_PAUSE_MS)).await;
            }
            (status, code) => phase.other.lock().expect("lock").push(format!("{status} {code}")),
        }
    }
}

/// Runs `clients` closed-loop clients for a phase, sampling the server's memory.
async fn run_phase(server: &ServerProcess, clients: usize, peak_kib: &AtomicU64) -> Phase {
    let phase = Phase::default();
    let stop = AtomicBool::new(false);
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(clients)
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    let loops = (0..clients).map(|_| client_loop(http.clone(), server.url.clone(), &phase, &stop));
    let sampler = async {
        let end = Instant::now() + Duration::from_millis(PHASE_MS);
        while Instant::now() < end {
            peak_kib.fetch_max(server.resident_kib(), Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        stop.store(true, Ordering::Relaxed);
    };
    tokio::join!(futures::future::join_all(loops), sampler);
    phase
}

fn percentile_99(latencies: &Mutex<Vec<u128>>) -> u128 {
    let mut latencies = latencies.lock().expect("lock").clone();
    latencies.sort_unstable();
    latencies.get(latencies.len() * 99 / 100).copied().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_times_the_in_flight_cap_is_shed_fast_in_bounded_memory_and_throughput_holds() {
    let setup = BackendSetup::start(StoreKind::Embedded).await;
    let carrier = start_carrier((CARRIER_LATENCY_MS, CARRIER_LATENCY_MS), 0.0, setup.data.path()).await;
    let mut env = setup.env();
    env.extend([
        pair("IDEM__SERVER__LISTEN", "127.0.0.1:0"),
        pair("IDEM__SERVER__IN_FLIGHT_MAX", IN_FLIGHT_MAX),
        pair("IDEM__CALLERS", callers_env()),
        pair("IDEM__CARRIER__URL", &carrier.url),
    ]);
    let server = start_server(&[], &env, None, setup.data.path()).await;
    let peak_kib = AtomicU64::new(0);
    let baseline = run_phase(&server, IN_FLIGHT_MAX, &peak_kib).await;
    let baseline_peak_kib = peak_kib.swap(0, Ordering::Relaxed);
    let overload = run_phase(&server, IN_FLIGHT_MAX * OVERLOAD_FACTOR, &peak_kib).await;
    let overload_peak_kib = peak_kib.load(Ordering::Relaxed);

    let seconds = PHASE_MS as f64 / 1_000.0;
    let baseline_rate = baseline.admitted.load(Ordering::Relaxed) as f64 / seconds;
    let overload_rate = overload.admitted.load(Ordering::Relaxed) as f64 / seconds;
    let shed_p99_ms = percentile_99(&overload.shed_latencies_ms);
    eprintln!(
        "RELIABILITY overload cap={IN_FLIGHT_MAX} clients={} baseline_admitted_per_s={baseline_rate:.0} \
         overload_admitted_per_s={overload_rate:.0} shed={} shed_p99_ms={shed_p99_ms} \
         rss_mib_baseline={} rss_mib_overload_peak={} other_answers={:?}",
        IN_FLIGHT_MAX * OVERLOAD_FACTOR,
        overload.shed.load(Ordering::Relaxed),
        baseline_peak_kib / 1_024,
        overload_peak_kib / 1_024,
        overload.other.lock().expect("lock").len(),
    );
    assert!(
        baseline.other.lock().expect("lock").is_empty(),
        "{:?}",
        baseline.other.lock().expect("lock")
    );
    assert!(
        overload.other.lock().expect("lock").is_empty(),
        "{:?}",
        overload.other.lock().expect("lock")
    );
    assert!(overload.shed.load(Ordering::Relaxed) > 0, "ten times the cap must shed");
    assert!(shed_p99_ms <= SHED_P99_MS_MAX, "shed p99 {shed_p99_ms} ms");
    assert!(
        overload_peak_kib / 1_024 <= RESIDENT_MIB_MAX,
        "{} MiB resident",
        overload_peak_kib / 1_024
    );
    assert!(
        overload_rate >= baseline_rate * THROUGHPUT_HELD_SHARE_MIN,
        "admitted {overload_rate:.0}/s under overload against {baseline_rate:.0}/s at the cap"
    );
    let _ = server.terminate().await.0;
    let _ = carrier.terminate().await.0;
}
