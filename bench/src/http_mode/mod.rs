//! Http mode: the Fulfilment service against a running (or spawned) Label
//! service, open-loop, then the audit of every intent.

pub mod audit;
pub mod carrier;
pub mod cli;
pub mod client;
pub mod connection_pool;
pub mod costs;
pub mod metrics;
pub mod overload;
pub mod spawn;

use crate::cli::CompareArgs;
use crate::engine::{LoadPlan, PlanError, run_open_loop};
use crate::intent::RunIds;
use crate::interrupt;
use crate::ramp::{RampReport, RampSettings, run_ramp};
use crate::report::{RunSummary, Table};
use audit::{AnswerCounts, AuditInput, AuditReport, audit};
use cli::{ClientProfile, FulfilmentArgs, HttpArgs, KeyMode, Profile};
use client::{ClientError, ClientSettings, FulfilmentClient, PreferWaitReport, answered_409};
use connection_pool::PoolOrder;
use costs::{CostMeter, ProcessCpu};
use overload::{OverloadReport, ServiceSampler, run_overload};
use serde::{Deserialize, Serialize};
use spawn::{SpawnError, SpawnSettings, SpawnedServer};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use store_registry::StoreKind;

/// Longest wait after the load for the server's requests in flight to end.
const SERVER_DRAIN_MS_MAX: u64 = 15_000;
/// How often a spawned server's resident memory is sampled.
const RSS_SAMPLE_MS: u64 = 500;
/// Timeout of the audit's own requests (metrics, carrier stats).
const AUDIT_REQUEST_MS: u64 = 10_000;

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("server: {0}")]
    Spawn(#[from] SpawnError),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("the Label service at {url} is not reachable: {detail}")]
    Unreachable { url: String, detail: String },
    #[error(transparent)]
    Placement(#[from] crate::placement::PlacementError),
}

/// Where the Label service is.
#[derive(Debug, Clone)]
pub enum ServerTarget {
    /// Already running at `urls` (one or several instances on one store);
    /// their carrier simulator at `carrier_url`.
    Running {
        urls: Vec<String>,
        carrier_url: Option<String>,
    },
    Spawn(SpawnSettings),
}

/// One http-mode run, from the command line.
#[derive(Debug, Clone)]
pub struct HttpRun {
    pub target: ServerTarget,
    pub fulfilment: FulfilmentArgs,
    pub plan: LoadPlan,
    pub ramp: Option<RampSettings>,
    /// The phases of the overload or metastable profile, when that is the
    /// profile, and whether it is reported second by second.
    pub phases: Option<(Vec<overload::Phase>, bool)>,
    pub slo_p99_ms: f64,
    pub seed: u64,
    /// The service and its stores on one CPU, the bench and the carrier on
    /// the other ([`crate::placement`]).
    pub split_cpus: bool,
}

impl HttpRun {
    pub fn from_args(args: &HttpArgs, seed: u64) -> Self {
        let target = match args.urls.is_empty() {
            false => ServerTarget::Running {
                urls: args.urls.clone(),
                carrier_url: args.carrier_url.clone(),
            },
            true => ServerTarget::Spawn(SpawnSettings {
                store_kind: args.store_kind,
                server_bin: args.server_bin.clone(),
                backend: args.backend.clone(),
                carrier: args.fulfilment.carrier(),
                seed,
                fleet: spawn::FleetSettings {
                    instances: args.instances,
                    labels_in_postgres: args.labels_in_postgres,
                    redis_cluster: args.redis_cluster,
                },
            }),
        };
        Self {
            target,
            fulfilment: args.fulfilment.clone(),
            plan: args.load.plan(seed, !args.output.quiet),
            ramp: args.load.ramp(),
            phases: profile_phases(args),
            slo_p99_ms: args.load.slo_p99_ms,
            seed,
            split_cpus: args.split_cpus,
        }
    }

    pub fn for_compare(args: &CompareArgs, store_kind: StoreKind, seed: u64) -> Self {
        Self {
            target: ServerTarget::Spawn(SpawnSettings {
                store_kind,
                server_bin: None,
                backend: args.backend.clone(),
                carrier: args.http.carrier(),
                seed,
                fleet: spawn::FleetSettings::default(),
            }),
            fulfilment: args.http.clone(),
            plan: args.load.plan(seed, !args.output.quiet),
            ramp: args.load.ramp(),
            phases: None,
            slo_p99_ms: args.load.slo_p99_ms,
            seed,
            split_cpus: false,
        }
    }

    fn store_kind_name(&self) -> String {
        match &self.target {
            ServerTarget::Running { .. } => "running".into(),
            ServerTarget::Spawn(settings) => settings.store_kind.name().into(),
        }
    }
}

/// Everything one http run measured and found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HttpReport {
    pub store_kind: String,
    pub key_mode: KeyMode,
    /// How the client retried (`--client-profile`); absent in reports
    /// written before the report named it.
    #[serde(default)]
    pub client_profile: Option<ClientProfile>,
    /// Who got a connection that came free (`--pool-order`); absent in
    /// reports written before the report named it.
    #[serde(default)]
    pub pool_order: Option<PoolOrder>,
    pub url: String,
    pub notes: Vec<String>,
    pub open_loop: Option<RunSummary>,
    pub ramp: Option<RampReport>,
    pub overload: Option<OverloadReport>,
    /// Retries the client's empty quota did not pay for: deferred to the
    /// longest backoff (polite), or the intent given up (standard).
    pub retries_refused_by_quota: u64,
    /// What `--prefer-wait` did, when it was set.
    #[serde(default)]
    pub prefer_wait: Option<PreferWaitReport>,
    /// Every attempt's answer by kind, warm-up included.
    pub attempts: BTreeMap<String, u64>,
    pub audit: AuditReport,
    /// Peak resident memory of a spawned server (`VmHWM`), in MiB.
    pub server_peak_rss_mib: Option<f64>,
    /// Highest resident memory sampled during the load, in MiB.
    pub server_max_sampled_rss_mib: Option<f64>,
    /// CPU used by each process during the load, and per intent: on one
    /// small machine, this is what limits the rate.
    pub cpu: Vec<ProcessCpu>,
}

impl HttpReport {
    fn empty(run: &HttpRun, server: &Server) -> Self {
        Self {
            store_kind: run.store_kind_name(),
            key_mode: run.fulfilment.key_mode,
            client_profile: Some(run.fulfilment.client_profile),
            pool_order: Some(run.fulfilment.pool_order),
            url: server.base_urls.join(" "),
            notes: server.spawned.as_ref().map(|s| s.notes.clone()).unwrap_or_default(),
            open_loop: None,
            ramp: None,
            overload: None,
            retries_refused_by_quota: 0,
            prefer_wait: None,
            attempts: BTreeMap::new(),
            audit: AuditReport::default(),
            server_peak_rss_mib: None,
            server_max_sampled_rss_mib: None,
            cpu: Vec::new(),
        }
    }

    /// The audit and the server's memory, as text.
    pub fn render(&self) -> String {
        let verdict = if self.audit.passed { "PASSED" } else { "FAILED" };
        let mut text = format!(
            "http {} ({} keys{}) audit {verdict}: {} intents ({} sent twice), {} labelled exactly once, {} lost, {} with duplicate labels, {} parcels bought more than once\n",
            self.store_kind,
            self.key_mode,
            self.client_profile
                .map(|profile| format!(", {profile} client"))
                .unwrap_or_default()
                + &self
                    .pool_order
                    .map(|order| format!(", {order} pool"))
                    .unwrap_or_default(),
            self.audit.intents,
            self.audit.intents_sent_twice,
            self.audit.labelled_exactly_once,
            self.audit.lost,
            self.audit.duplicate_labels,
            self.audit.parcels_bought_twice,
        );
        let mut table = Table::new(&["answers", "client", "server", "agrees"]);
        for check in &self.audit.count_checks {
            table.row(vec![
                check.category.clone(),
                check.client.to_string(),
                check.server.to_string(),
                if check.agrees { "yes" } else { "NO" }.into(),
            ]);
        }
        text.push_str(&table.render());
        let attempts: Vec<String> = self
            .attempts
            .iter()
            .map(|(kind, count)| format!("{kind}={count}"))
            .collect();
        text.push_str(&format!("attempts: {}\n", attempts.join(" ")));
        if self.retries_refused_by_quota > 0 {
            text.push_str(&format!(
                "retries the client's empty retry quota did not pay for ({}): {}\n",
                match self.client_profile {
                    Some(ClientProfile::Polite) => "deferred to the longest backoff",
                    Some(ClientProfile::Standard) => "the intent gave up",
                    Some(ClientProfile::Aggressive) | None => "polite: deferred; standard: the intent gave up",
                },
                self.retries_refused_by_quota
            ));
        }
        if let Some(prefer_wait) = &self.prefer_wait {
            text.push_str(&prefer_wait.render());
        }
        if let Some(overload) = &self.overload {
            text.push_str(&overload.render());
        }
        if let (Some(peak), Some(sampled)) = (self.server_peak_rss_mib, self.server_max_sampled_rss_mib) {
            text.push_str(&format!(
                "server resident memory: peak {peak:.1} MiB, highest sampled during load {sampled:.1} MiB\n"
            ));
        }
        let cpu: Vec<String> = self
            .cpu
            .iter()
            .map(|process| {
                format!(
                    "{} {:.1} s ({:.2} ms/intent)",
                    process.process, process.cpu_s, process.ms_per_intent
                )
            })
            .collect();
        if !cpu.is_empty() {
            text.push_str(&format!("cpu during the load: {}\n", cpu.join(", ")));
        }
        let switches: Vec<String> = self
            .cpu
            .iter()
            .filter_map(|process| {
                let per_intent = process.context_switches_per_intent?;
                Some(format!("{} {per_intent:.1}", process.process))
            })
            .collect();
        if !switches.is_empty() {
            text.push_str(&format!("context switches per intent: {}\n", switches.join(", ")));
        }
        for problem in &self.audit.problems {
            text.push_str(&format!("PROBLEM: {problem}\n"));
        }
        for note in self.audit.notes.iter().chain(&self.notes) {
            text.push_str(&format!("note: {note}\n"));
        }
        text
    }
}

/// The server for one run: spawned (and owned) or already running.
struct Server {
    /// One URL per instance.
    base_urls: Vec<String>,
    carrier_url: String,
    spawned: Option<SpawnedServer>,
}

async fn start(run: &HttpRun) -> Result<Server, HttpError> {
    match &run.target {
        ServerTarget::Running { urls, carrier_url } => {
            let base_urls: Vec<String> = urls.iter().map(|url| url.trim_end_matches('/').to_owned()).collect();
            let carrier_url = carrier_url.clone().unwrap_or_else(|| base_urls[0].clone());
            Ok(Server {
                base_urls,
                carrier_url: carrier_url.trim_end_matches('/').to_owned(),
                spawned: None,
            })
        }
        ServerTarget::Spawn(settings) if run.split_cpus => spawn_split(settings).await,
        ServerTarget::Spawn(settings) => {
            let spawned = spawn::spawn(settings).await?;
            Ok(Server {
                base_urls: spawned.base_urls.clone(),
                carrier_url: spawned.carrier_url.clone(),
                spawned: Some(spawned),
            })
        }
    }
}

/// Spawns the service and its stores on [`placement::SERVICE_CPU`] (they
/// inherit the bench's CPU while it is pinned there), then moves the bench
/// and the carrier simulator to [`placement::CLIENT_CPU`].
async fn spawn_split(settings: &SpawnSettings) -> Result<Server, HttpError> {
    use crate::placement::{CLIENT_CPU, SERVICE_CPU, check_cpus, pin};
    check_cpus()?;
    let bench = std::process::id();
    pin(bench, SERVICE_CPU)?;
    let mut spawned = spawn::spawn(settings).await?;
    if let Some(carrier) = spawned.carrier_pid() {
        pin(carrier, CLIENT_CPU)?;
    }
    pin(bench, CLIENT_CPU)?;
    spawned.notes.push(format!(
        "placement: label service and stores on CPU {SERVICE_CPU}, idem-bench and the carrier simulator on CPU {CLIENT_CPU}"
    ));
    Ok(Server {
        base_urls: spawned.base_urls.clone(),
        carrier_url: spawned.carrier_url.clone(),
        spawned: Some(spawned),
    })
}

/// The phases of the profile `args` asks for, if it has phases.
fn profile_phases(args: &HttpArgs) -> Option<(Vec<overload::Phase>, bool)> {
    let seconds = Duration::from_secs;
    match args.profile {
        Profile::Steady => None,
        Profile::Overload => Some((overload::overload_phases(seconds(args.phase_s)), false)),
        Profile::Metastable => Some((
            overload::metastable_phases(
                seconds(args.steady_s),
                args.trigger_multiplier,
                seconds(args.trigger_s),
                seconds(args.after_s),
            ),
            true,
        )),
    }
}

/// Runs the load, waits for every copy of every intent and for the server
/// to go idle, then audits. Interrupted, the load stops early and both
/// waits end at the interrupt's drain deadline; a spawned server is
/// stopped when this returns, as on any other run.
pub async fn run(run: &HttpRun) -> Result<HttpReport, HttpError> {
    let server = start(run).await?;
    let admin = reqwest::Client::builder()
        .timeout(Duration::from_millis(AUDIT_REQUEST_MS))
        .build()
        .map_err(|error| ClientError::Build(error.to_string()))?;
    let before = scrape_answers(&admin, &server.base_urls)
        .await
        .map_err(|detail| HttpError::Unreachable {
            url: server.base_urls.join(" "),
            detail,
        })?;
    let settings = ClientSettings::new(&server.base_urls, &run.fulfilment, run.seed)?;
    let client = Arc::new(FulfilmentClient::new(settings, RunIds::random())?);
    let rss = RssSampler::start(server.spawned.as_ref().and_then(SpawnedServer::pid));
    let mut report = HttpReport::empty(run, &server);
    let cpu = CostMeter::start(server.spawned.as_ref());
    let plan = LoadPlan {
        label: format!("http {}", report.store_kind),
        ..run.plan.clone()
    };
    match (&run.ramp, &run.phases) {
        (_, Some((phases, by_second))) => {
            let sampler = by_second.then(|| ServiceSampler::start(admin.clone(), server.base_urls.clone(), &client));
            let overload = run_overload(&plan, phases, run.slo_p99_ms, client.clone(), sampler.as_ref()).await?;
            report.overload = Some(overload);
        }
        (Some(ramp), None) => report.ramp = Some(run_ramp(ramp, &plan, client.clone()).await?),
        (None, None) => report.open_loop = Some(RunSummary::of_open_loop(&run_open_loop(&plan, client.clone()).await?)),
    }
    let limit = client.settings().copy_time_max();
    let copies_done = interrupt::global().until_drained(client.log.wait_all_done(limit));
    if !copies_done.await.unwrap_or(false) {
        report.notes.push(format!(
            "{} copies still running {} s after the load; their intents count as lost",
            client.log.copies_running(),
            limit.as_secs()
        ));
    }
    report.server_max_sampled_rss_mib = rss.stop();
    report.cpu = cpu.finish(client.log.len());
    for base_url in &server.base_urls {
        interrupt::global()
            .until_drained(wait_for_server_idle(&admin, base_url))
            .await;
    }
    report.attempts = client.counts.snapshot();
    report.retries_refused_by_quota = client.quota.refused();
    report.prefer_wait = run
        .fulfilment
        .prefer_wait
        .map(|seconds| client.waits.report(seconds, answered_409(&report.attempts)));
    report.audit = audit_run(&admin, &server, &client, &before, &report.attempts).await;
    if let Some(pid) = server.spawned.as_ref().and_then(SpawnedServer::pid) {
        report.server_peak_rss_mib = metrics::resident_kib(pid).map(|(_, peak)| peak as f64 / 1_024.0);
    }
    if !report.audit.passed
        && let Some(spawned) = &server.spawned
    {
        report
            .notes
            .push(format!("end of the server log:\n{}", spawned.log_tail()));
    }
    Ok(report)
}

async fn audit_run(
    admin: &reqwest::Client,
    server: &Server,
    client: &FulfilmentClient,
    before: &AnswerCounts,
    attempts: &BTreeMap<String, u64>,
) -> AuditReport {
    let intents = client.log.snapshot();
    let after = scrape_answers(admin, &server.base_urls).await;
    let server_answers = after.as_ref().ok().map(|after| metrics::difference(after, before));
    let carrier = carrier::fetch_stats(admin, &server.carrier_url).await;
    let mut report = audit(&AuditInput {
        intents: &intents,
        client_kinds: attempts,
        carrier: carrier.as_ref().ok(),
        server: server_answers.as_ref(),
    });
    if let Err(error) = &after {
        report.notes.push(format!("metrics: {error}"));
    }
    if let Err(error) = &carrier {
        report.notes.push(format!("carrier stats: {error}"));
    }
    report
}

async fn scrape(admin: &reqwest::Client, base_url: &str) -> Result<String, String> {
    let response = admin
        .get(format!("{base_url}/metrics"))
        .send()
        .await
        .map_err(|error| error.to_string())?;
    if !response.status().is_success() {
        return Err(format!("GET /metrics answered {}", response.status()));
    }
    response.text().await.map_err(|error| error.to_string())
}

/// The label route's answers, summed over every instance.
async fn scrape_answers(admin: &reqwest::Client, base_urls: &[String]) -> Result<AnswerCounts, String> {
    let mut total = AnswerCounts::default();
    for base_url in base_urls {
        let text = scrape(admin, base_url)
            .await
            .map_err(|error| format!("{base_url}: {error}"))?;
        total = metrics::sum(&total, &metrics::label_answers(&text));
    }
    Ok(total)
}

/// Waits until the server reports no request in flight, so its counters
/// include every answer to the run's requests.
async fn wait_for_server_idle(admin: &reqwest::Client, base_url: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(SERVER_DRAIN_MS_MAX);
    while tokio::time::Instant::now() < deadline {
        let Ok(text) = scrape(admin, base_url).await else {
            return;
        };
        // The scrape itself is a request in flight while it is answered.
        let in_flight: f64 = metrics::samples(&text, "idem_http_requests_in_flight")
            .iter()
            .map(|sample| sample.value)
            .sum();
        if in_flight <= 1.0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Samples a process's resident memory in the background.
struct RssSampler {
    highest_kib: Arc<AtomicU64>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl RssSampler {
    fn start(pid: Option<u32>) -> Self {
        let highest_kib = Arc::new(AtomicU64::new(0));
        let task = pid.map(|pid| {
            let highest_kib = highest_kib.clone();
            tokio::spawn(async move {
                loop {
                    if let Some((rss, _)) = metrics::resident_kib(pid) {
                        highest_kib.fetch_max(rss, Ordering::Relaxed);
                    }
                    tokio::time::sleep(Duration::from_millis(RSS_SAMPLE_MS)).await;
                }
            })
        });
        Self { highest_kib, task }
    }

    /// The highest sample in MiB, if the process was sampled.
    fn stop(self) -> Option<f64> {
        let task = self.task?;
        task.abort();
        Some(self.highest_kib.load(Ordering::Relaxed) as f64 / 1_024.0)
    }
}
