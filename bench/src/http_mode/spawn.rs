//! A Label service (plus its in-process carrier simulator) spawned for one
//! run: a config file in a temporary directory, a free loopback port, the
//! backend's own server when the store kind needs one, and a kill on drop.
//! Each process is tied to the bench (test-support's process harness): the
//! kernel kills it if the bench dies without stopping it.
//!
//! The temporary directory's name, [`SPAWN_DIRECTORY_PREFIX`], is in every
//! spawned process's command line (`--config DIR/server-0.toml`): it is how
//! a later run finds services an earlier one left behind.

use crate::cli::{BackendArgs, DurabilityArg};
use crate::store_mode::KeepAlive;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use store_registry::StoreKind;
use test_support::process::{OnDrop, ProcessError, ProcessSpec, Readiness, ServerProcess};

/// The server binary's name (server).
pub const SERVER_BINARY: &str = "server";
/// Environment variable naming the server binary, for tests and CI.
pub const SERVER_BINARY_VARIABLE: &str = "IDEM_SERVER_BIN";
/// Bytes of the server's log shown when it fails.
const LOG_TAIL_BYTES_MAX: usize = test_support::process::LOG_TAIL_BYTES_MAX;
/// The start of the name of every spawned service's temporary directory.
pub const SPAWN_DIRECTORY_PREFIX: &str = "idem-bench-server-";
/// Leftover services named one by one in the warning; the rest are counted.
const LEFTOVER_SERVICES_SHOWN_MAX: usize = 5;
/// Bytes of a leftover service's command line shown.
const LEFTOVER_COMMAND_BYTES_MAX: usize = 200;
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error(
        "the server binary was not found ({0}); build it with `cargo build --release -p server` or name it with --server-bin or {SERVER_BINARY_VARIABLE}"
    )]
    BinaryMissing(String),
    #[error("{0}")]
    Backend(String),
    /// It did not start, or not ready (test-support's process harness).
    #[error("the server: {0}")]
    Process(#[from] ProcessError),
    #[error("spawn I/O: {0}")]
    Io(#[from] std::io::Error),
}

/// What a spawned server is configured with.
#[derive(Debug, Clone)]
pub struct SpawnSettings {
    pub store_kind: StoreKind,
    pub server_bin: Option<PathBuf>,
    pub backend: BackendArgs,
    pub carrier: CarrierSettings,
    pub seed: u64,
    pub fleet: FleetSettings,
}

/// How many instances share the store, and the store's shape for a fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FleetSettings {
    pub instances: usize,
    /// Redis records with labels in PostgreSQL (a store a fleet can share).
    pub labels_in_postgres: bool,
    pub redis_cluster: bool,
}

impl Default for FleetSettings {
    fn default() -> Self {
        Self {
            instances: 1,
            labels_in_postgres: false,
            redis_cluster: false,
        }
    }
}

/// The carrier simulator's behaviour.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CarrierSettings {
    pub lost_reply_rate: f64,
    pub latency_ms_min: u64,
    pub latency_ms_max: u64,
}

/// Starts `binary ARGS` in `dir` (test-support's process harness, as the
/// server's tests start it), ready once `ready_url` answers, stopped with
/// SIGTERM (then SIGKILL) when dropped.
async fn start_process(
    binary: &Path,
    arguments: &[&str],
    dir: &Path,
    ready_url: &str,
) -> Result<ServerProcess, SpawnError> {
    let mut spec = ProcessSpec::new(binary, arguments, dir);
    spec.readiness = Readiness::Probe(ready_url.to_owned());
    spec.on_drop = OnDrop::Terminate;
    Ok(ServerProcess::start(spec).await?)
}

/// A running Label service and its carrier simulator, each a process of
/// its own, so the service's memory is measured without the carrier's.
pub struct SpawnedServer {
    // Field order is drop order: the services stop before their carrier and
    // their store's server.
    services: Vec<ServerProcess>,
    carrier: ServerProcess,
    /// One per instance.
    pub base_urls: Vec<String>,
    pub carrier_url: String,
    pub notes: Vec<String>,
    _backend: Vec<KeepAlive>,
    _dir: tempfile::TempDir,
}

impl SpawnedServer {
    /// The (first) Label service's process id.
    pub fn pid(&self) -> Option<u32> {
        self.services.first().and_then(ServerProcess::pid)
    }

    /// Every instance's process id.
    pub fn pids(&self) -> Vec<u32> {
        self.services.iter().filter_map(ServerProcess::pid).collect()
    }

    pub fn carrier_pid(&self) -> Option<u32> {
        self.carrier.pid()
    }

    pub fn log_tail(&self) -> String {
        self.services
            .iter()
            .map(|service| service.log_tail(LOG_TAIL_BYTES_MAX))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The server binary: `--server-bin`, then `IDEM_SERVER_BIN`, then `server`
/// beside this executable (or one directory up, for test binaries in
/// `target/*/deps`).
pub fn find_server_binary(explicit: Option<&Path>) -> Result<PathBuf, SpawnError> {
    if let Some(path) = explicit {
        return existing(path.to_path_buf());
    }
    if let Some(path) = std::env::var_os(SERVER_BINARY_VARIABLE) {
        return existing(PathBuf::from(path));
    }
    let exe = std::env::current_exe()?;
    let mut tried = Vec::new();
    for dir in exe.ancestors().skip(1).take(2) {
        let candidate = dir.join(SERVER_BINARY);
        if candidate.is_file() {
            return Ok(candidate);
        }
        tried.push(candidate.display().to_string());
    }
    Err(SpawnError::BinaryMissing(format!("tried {}", tried.join(", "))))
}

/// The path made absolute: a spawned process runs in a directory of its
/// own, where a path relative to the bench's would name nothing.
fn existing(path: PathBuf) -> Result<PathBuf, SpawnError> {
    match std::fs::canonicalize(&path) {
        Ok(absolute) if absolute.is_file() => Ok(absolute),
        _ => Err(SpawnError::BinaryMissing(path.display().to_string())),
    }
}

/// A loopback port nothing listens on right now, below the ephemeral range.
pub fn free_port() -> Result<u16, SpawnError> {
    Ok(test_support::free_loopback_port()?)
}

/// Starts the carrier simulator, then the Label service configured to use
/// it, and waits until both answer.
pub async fn spawn(settings: &SpawnSettings) -> Result<SpawnedServer, SpawnError> {
    let binary = find_server_binary(settings.server_bin.as_deref())?;
    let dir = tempfile::Builder::new().prefix(SPAWN_DIRECTORY_PREFIX).tempdir()?;
    let (store_section, backend, mut notes) = store_config(settings, dir.path()).await?;
    let carrier_port = free_port()?;
    let carrier_url = format!("http://127.0.0.1:{carrier_port}");
    let carrier_config = dir.path().join("carrier.toml");
    std::fs::write(&carrier_config, simulator_config(settings))?;
    let listen = format!("127.0.0.1:{carrier_port}");
    let config_arg = carrier_config.display().to_string();
    let carrier = start_process(
        &binary,
        &["--config", &config_arg, "carrier", "--listen", &listen],
        dir.path(),
        &format!("{carrier_url}{}", super::carrier::STATS_PATH),
    )
    .await?;
    let instances = settings.fleet.instances.clamp(1, super::cli::INSTANCES_MAX);
    let (mut services, mut base_urls) = (Vec::new(), Vec::new());
    for number in 0..instances {
        let port = free_port()?;
        let config_path = dir.path().join(format!("server-{number}.toml"));
        std::fs::write(&config_path, server_config(port, &store_section, &carrier_url))?;
        let config_arg = config_path.display().to_string();
        let base_url = format!("http://127.0.0.1:{port}");
        let ready_url = format!("{base_url}/readyz");
        let service = start_process(&binary, &["--config", &config_arg], dir.path(), &ready_url).await?;
        services.push(service);
        base_urls.push(base_url);
    }
    let pids: Vec<String> = services
        .iter()
        .filter_map(ServerProcess::pid)
        .map(|pid| pid.to_string())
        .collect();
    notes.push(format!(
        "server: {} ({} instance(s), pid {}), carrier simulator pid {}, latency {}..={} ms, lost replies {}",
        binary.display(),
        instances,
        pids.join(", "),
        carrier.pid().unwrap_or(0),
        settings.carrier.latency_ms_min,
        settings.carrier.latency_ms_max,
        settings.carrier.lost_reply_rate
    ));
    Ok(SpawnedServer {
        services,
        carrier,
        base_urls,
        carrier_url,
        notes,
        _backend: backend,
        _dir: dir,
    })
}

/// A process on this machine that a bench run spawned (its config is in a
/// [`SPAWN_DIRECTORY_PREFIX`] directory), found through `/proc`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeftoverService {
    pub pid: u32,
    pub command_line: String,
}

/// Every process, other than this one, whose command line names a config
/// file in a bench's spawn directory. Processes that end while being read
/// are skipped.
pub fn leftover_services() -> Vec<LeftoverService> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let own = std::process::id();
    let mut found: Vec<LeftoverService> = entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != own)
        .filter_map(|pid| {
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let arguments: Vec<String> = raw
                .split(|byte| *byte == 0)
                .map(|argument| String::from_utf8_lossy(argument).into_owned())
                .collect();
            is_spawned_service(&arguments).then(|| LeftoverService {
                pid,
                command_line: arguments.join(" ").trim_end().to_owned(),
            })
        })
        .collect();
    found.sort_by_key(|service| service.pid);
    found
}

/// `--config PATH` with PATH in a spawn directory.
fn is_spawned_service(arguments: &[String]) -> bool {
    let marker = format!("/{SPAWN_DIRECTORY_PREFIX}");
    arguments
        .windows(2)
        .any(|pair| pair[0] == "--config" && pair[1].contains(&marker))
}

/// One warning when services an earlier run spawned still run: their CPU
/// and memory would be taken from the run about to be measured.
pub fn leftover_service_warnings() -> Vec<String> {
    let services = leftover_services();
    if services.is_empty() {
        return Vec::new();
    }
    let shown: Vec<String> = services
        .iter()
        .take(LEFTOVER_SERVICES_SHOWN_MAX)
        .map(|service| {
            let mut command = service.command_line.clone();
            if command.len() > LEFTOVER_COMMAND_BYTES_MAX {
                let end = (0..=LEFTOVER_COMMAND_BYTES_MAX)
                    .rev()
                    .find(|at| command.is_char_boundary(*at))
                    .unwrap_or(0);
                command.truncate(end);
                command.push_str("...");
            }
            format!("pid {}: {command}", service.pid)
        })
        .collect();
    let more = services.len().saturating_sub(LEFTOVER_SERVICES_SHOWN_MAX);
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    vec![format!(
        "{} process(es) an earlier idem-bench run spawned still run on this machine ({}{more}); they take CPU and memory from this run, so its figures would be wrong: stop them first (kill PID)",
        services.len(),
        shown.join("; ")
    )]
}

fn simulator_config(settings: &SpawnSettings) -> String {
    let carrier = &settings.carrier;
    format!(
        "# Written by idem-bench for one run.\n[carrier.simulator]\nlatency_ms_min = {}\nlatency_ms_max = {}\nlost_reply_rate = {}\nseed = {}\n\n[log]\nlevel = \"warn\"\n",
        carrier.latency_ms_min,
        carrier.latency_ms_max,
        carrier.lost_reply_rate,
        // TOML integers are signed 64-bit.
        (settings.seed % i64::MAX as u64).max(1)
    )
}

fn server_config(port: u16, store_section: &str, carrier_url: &str) -> String {
    let mut config = String::new();
    let _ = writeln!(config, "# Written by idem-bench for one run.");
    // Every other server setting (in-flight cap, request timeout, lease)
    // stays at the server's default: the bench measures the server as it
    // ships.
    let _ = writeln!(config, "[server]\nlisten = \"127.0.0.1:{port}\"\n");
    config.push_str(store_section);
    let _ = writeln!(config, "\n[carrier]\nurl = \"{carrier_url}\"\n");
    let _ = writeln!(config, "[log]\nlevel = \"warn\"");
    config
}

type BackendGuards = Vec<KeepAlive>;

/// The `[store]` sections, the backend servers they need, and notes. The
/// embedded store is always configured: it holds the records with kind
/// `embedded` and the labels with kind `redis`.
async fn store_config(
    settings: &SpawnSettings,
    dir: &Path,
) -> Result<(String, BackendGuards, Vec<String>), SpawnError> {
    let durability = match settings.backend.embedded_durability {
        DurabilityArg::SyncData => "sync_data",
        DurabilityArg::SyncAll => "sync_all",
        DurabilityArg::Buffer => "buffer",
    };
    let path = settings
        .backend
        .embedded_dir
        .clone()
        .unwrap_or_else(|| dir.join("data"));
    let embedded = format!(
        "[store.embedded]\npath = {:?}\ndurability = \"{durability}\"\n{}",
        path.display().to_string(),
        claim_batch_line(&settings.backend)
    );
    let fleet = settings.fleet;
    let (mut kind_section, mut guards, mut notes) = match settings.store_kind {
        StoreKind::Embedded => (String::new(), Vec::new(), Vec::new()),
        StoreKind::Redis => redis_config(&settings.backend, fleet.redis_cluster).await?,
        StoreKind::Postgres => postgres_config(&settings.backend).await?,
        StoreKind::Foundationdb => foundationdb_config(&settings.backend)?,
        other => {
            let detail = format!("{other} is not a benchmarked backend");
            return Err(SpawnError::Backend(detail));
        }
    };
    let mut labels = String::new();
    if settings.store_kind == StoreKind::Redis && fleet.labels_in_postgres {
        let (postgres_section, postgres_guards, postgres_notes) = postgres_config(&settings.backend).await?;
        kind_section.push_str(&postgres_section);
        guards.extend(postgres_guards);
        notes.extend(postgres_notes.into_iter().map(|note| format!("labels: {note}")));
        labels = "labels = \"postgres\"\n".to_owned();
    }
    notes.insert(0, format!("embedded store durability {durability}"));
    let kind = settings.store_kind.name();
    let section = format!("[store]\nkind = \"{kind}\"\n{labels}\n{embedded}\n{kind_section}");
    Ok((section, guards, notes))
}

#[cfg(feature = "redis")]
async fn redis_config(args: &BackendArgs, cluster: bool) -> Result<(String, BackendGuards, Vec<String>), SpawnError> {
    if cluster {
        let nodes = tokio::task::block_in_place(store_redis::testkit::RedisCluster::start)
            .map_err(|error| SpawnError::Backend(error.to_string()))?;
        let urls = nodes.urls();
        let section = format!("[store.redis]\nurls = {urls:?}\ncluster = true\n");
        let note = format!("store: spawned Redis Cluster of three masters at {}", urls.join(", "));
        return Ok((section, vec![Box::new(nodes)], vec![note]));
    }
    let address = crate::store_mode::redis::server_for(args).map_err(|error| SpawnError::Backend(error.to_string()))?;
    let (url, guard, note) = (address.url, address.guard, address.note);
    let section = format!("[store.redis]\nurls = [{url:?}]\n");
    Ok((
        section,
        guard.into_iter().collect(),
        vec![format!("store: redis at {url} ({note})")],
    ))
}

#[cfg(not(feature = "redis"))]
async fn redis_config(_: &BackendArgs, _: bool) -> Result<(String, BackendGuards, Vec<String>), SpawnError> {
    Err(SpawnError::Backend("redis is not built into this binary".into()))
}

#[cfg(feature = "postgres")]
async fn postgres_config(args: &BackendArgs) -> Result<(String, BackendGuards, Vec<String>), SpawnError> {
    let address = crate::store_mode::postgres::database_for(args)
        .await
        .map_err(|error| SpawnError::Backend(error.to_string()))?;
    let (url, guard, note) = (address.url, address.guard, address.note);
    let section = format!("[store.postgres]\nurl = {url:?}\n");
    Ok((
        section,
        guard.into_iter().collect(),
        vec![format!("store: postgres ({note})")],
    ))
}

#[cfg(not(feature = "postgres"))]
async fn postgres_config(_: &BackendArgs) -> Result<(String, BackendGuards, Vec<String>), SpawnError> {
    Err(SpawnError::Backend("postgres is not built into this binary".into()))
}

/// `batch_items_max` for the FDB-style stores' sections when
/// `--claim-batch-items-max` is given; the server's default otherwise.
fn claim_batch_line(args: &BackendArgs) -> String {
    args.claim_batch_items_max
        .map(|items_max| format!("batch_items_max = {items_max}\n"))
        .unwrap_or_default()
}

/// The cluster is the one the bench is pointed at (never spawned); the
/// server needs its own `foundationdb` feature, else it refuses the kind at
/// startup and says so. Without this crate's feature the kind is refused
/// here too, for the same answer in store and http mode.
#[cfg(feature = "foundationdb")]
fn foundationdb_config(args: &BackendArgs) -> Result<(String, BackendGuards, Vec<String>), SpawnError> {
    let (cluster_file, shown) = crate::store_mode::foundationdb::cluster_file(args);
    // The server's own default is FoundationDB's, which FDB_CLUSTER_FILE
    // (inherited by the spawned server) overrides, as in store mode.
    let cluster_file = cluster_file.unwrap_or_default();
    let prefix = crate::store_mode::foundationdb::key_prefix(args);
    let section = format!(
        "[store.foundationdb]\ncluster_file = {cluster_file:?}\nkey_prefix = {prefix:?}\n{}",
        claim_batch_line(args)
    );
    let notes = vec![format!("store: foundationdb, cluster {shown}, key prefix {prefix:?}")];
    Ok((section, Vec::new(), notes))
}

#[cfg(not(feature = "foundationdb"))]
fn foundationdb_config(_: &BackendArgs) -> Result<(String, BackendGuards, Vec<String>), SpawnError> {
    Err(SpawnError::Backend("foundationdb is not built into this binary".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arguments(line: &str) -> Vec<String> {
        line.split(' ').map(str::to_owned).collect()
    }

    #[test]
    fn a_spawned_service_is_known_by_its_config_directory() {
        let service = arguments("/x/server --config /tmp/idem-bench-server-Ab12/server-0.toml");
        let carrier =
            arguments("server --config /var/tmp/idem-bench-server-Zz/carrier.toml carrier --listen 127.0.0.1:20001");
        assert!(is_spawned_service(&service));
        assert!(is_spawned_service(&carrier));
        // Not the bench itself, nor a service an operator started.
        assert!(!is_spawned_service(&arguments("idem-bench http --rate 100")));
        assert!(!is_spawned_service(&arguments("server --config /etc/idem/server.toml")));
        assert!(!is_spawned_service(&arguments(
            "vi /tmp/idem-bench-server-Ab12/server-0.toml"
        )));
    }

    fn backend_args(claim_batch_items_max: Option<usize>) -> BackendArgs {
        BackendArgs {
            embedded_durability: DurabilityArg::SyncData,
            embedded_dir: None,
            redis_url: None,
            redis_persistence: crate::cli::RedisPersistence::Everysec,
            postgres_url: None,
            foundationdb_cluster_file: None,
            foundationdb_key_prefix: None,
            claim_batch_items_max,
        }
    }

    /// The server the bench spawns loads its config as any server does.
    async fn spawned_config(backend: BackendArgs) -> server::Config {
        let dir = tempfile::tempdir().unwrap();
        let settings = SpawnSettings {
            store_kind: StoreKind::Embedded,
            server_bin: None,
            backend,
            carrier: CarrierSettings {
                lost_reply_rate: 0.0,
                latency_ms_min: 0,
                latency_ms_max: 0,
            },
            seed: 1,
            fleet: FleetSettings::default(),
        };
        let (section, _guards, _notes) = store_config(&settings, dir.path()).await.unwrap();
        let path = dir.path().join("server-0.toml");
        std::fs::write(&path, server_config(20_000, &section, "http://127.0.0.1:20001")).unwrap();
        server::Config::load(Some(&path), std::iter::empty()).expect("the spawned server's config")
    }

    #[tokio::test]
    async fn the_claim_batch_bound_reaches_the_spawned_server_only_when_given() {
        let given = spawned_config(backend_args(Some(8))).await;
        assert_eq!(given.store.embedded.batch_items_max, 8);
        let default = spawned_config(backend_args(None)).await;
        assert_eq!(
            default.store.embedded.batch_items_max,
            store_fdb::EmbeddedConfig::default().batch_items_max
        );
    }

    #[test]
    fn a_relative_server_binary_is_made_absolute() {
        // Tests run in the package's directory, which holds Cargo.toml.
        let found = find_server_binary(Some(Path::new("Cargo.toml"))).expect("an existing file");
        assert!(found.is_absolute(), "{}", found.display());
        assert!(found.ends_with("bench/Cargo.toml"));
        assert!(matches!(
            find_server_binary(Some(Path::new("no-such-server"))),
            Err(SpawnError::BinaryMissing(_))
        ));
    }
}
