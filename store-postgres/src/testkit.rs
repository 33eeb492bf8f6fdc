//! A real PostgreSQL server for tests: a throw-away cluster made with
//! `initdb` in a temporary directory, started on a free 127.0.0.1 port, with
//! a fresh database per [`PostgresServer::create_database`] call, stopped on
//! drop. Nothing depends on a server someone else started.
//!
//! PostgreSQL refuses to run as root, so under root the cluster belongs to
//! the `postgres` OS user (Debian's package creates it) and every server
//! command runs through `runuser -u postgres --`.
//!
//! [`PostgresServer::start_tls`] starts one with `ssl = on`, certificates
//! the test generates, and a `pg_hba.conf` that accepts TCP connections
//! only over TLS (`hostssl`), so a plain connection is refused.
//!
//! A server kept in a `static` is never dropped, so each server also starts
//! a small watchdog process that stops it and removes its directory once the
//! test process has exited, however it exited.
//!
//! `initdb` runs once per PostgreSQL build and OS user: its cluster is kept
//! as a template in the temporary directory ([`TEMPLATE_DIRECTORY_PREFIX`])
//! and each server starts on a copy of it, the same files `initdb` would
//! have written again (a test process starts its own server, and `initdb`
//! took most of a short test's time).

use crate::claim_batch::{BatchedClaim, ClaimBatchRunner, ClaimItem};
use crate::completion_batch::{CompletionBatchRunner, CompletionEffect, CompletionItem, OwnedRowEffect};
use crate::config::{PostgresConfig, SslMode};
use crate::effect::RowCompletion;
use crate::migrate::{MigrateError, Migration};
use crate::row::Slot;
use crate::store::PostgresStore;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use store_core::{BatchRunner, ClaimOutcome, ClaimRequest, Fenced, HeldLease, Policy, SavedResponse, StoreError};
use tempfile::TempDir;
use test_support::tls::TestCertificates;

/// The batched claim's statement, for tests that look at its plan.
pub const CLAIM_BATCH_STATEMENT: &str = crate::claim_batch::CLAIM_BATCH;
/// Where Debian's packages install the server binaries, one folder per version.
pub const DEBIAN_POSTGRESQL_DIR: &str = "/usr/lib/postgresql";
/// Names a folder with `initdb`, `pg_ctl` and `postgres` to use instead.
pub const BIN_DIR_VARIABLE: &str = "IDEM_POSTGRES_BIN_DIR";
/// More server settings, appended to the harness's own (`-c name=value`
/// ...): a way to look inside a benchmark's server, e.g. with
/// `pg_stat_statements` (BENCHMARKS.md).
pub const EXTRA_OPTIONS_VARIABLE: &str = "IDEM_POSTGRES_SERVER_OPTIONS";
/// The OS user that owns the cluster when the tests run as root.
pub const SERVER_OS_USER: &str = "postgres";
/// The database superuser the cluster is made with; connections trust it.
pub const SUPERUSER: &str = "postgres";
/// How long `pg_ctl` waits for the server to accept connections.
pub const SERVER_START_TIMEOUT_S: u32 = 60;
/// Ports tried before giving up, in case another process takes the free
/// port between choosing it and the server binding it.
pub const SERVER_START_ATTEMPTS: u32 = 3;
/// Connections the test server accepts; every test's pool draws on it.
pub const SERVER_CONNECTIONS_MAX: u32 = 300;
/// `pg_hba.conf` of a TLS server: the harness's Unix socket, and TCP
/// connections only over TLS.
pub const TLS_ONLY_HBA: &str =
    "local all all trust\nhostssl all all 127.0.0.1/32 trust\nhostssl all all ::1/128 trust\n";
/// How often the watchdog checks whether the test process is still alive.
pub const WATCHDOG_POLL_S: u32 = 1;
/// The start of the name of the template clusters' folders in the
/// temporary directory; the rest names the PostgreSQL build, the OS user
/// and [`TEMPLATE_FORMAT`].
pub const TEMPLATE_DIRECTORY_PREFIX: &str = "idem-postgres-template-";
/// Changes whenever `initdb`'s arguments do, so an older template is never
/// copied.
pub const TEMPLATE_FORMAT: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("PostgreSQL server binaries not found ({0}); install Debian's postgresql package")]
    NotInstalled(String),
    #[error("{action}: {source}")]
    Io {
        action: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{command} failed: {output}")]
    Command { command: String, output: String },
    #[error("could not create a database: {0}")]
    Database(#[from] tokio_postgres::Error),
    #[error("store for the test database: {0}")]
    Store(String),
    #[error(transparent)]
    Migrate(#[from] MigrateError),
}

fn io_error(action: impl Into<String>) -> impl FnOnce(std::io::Error) -> HarnessError {
    let action = action.into();
    move |source| HarnessError::Io { action, source }
}

/// Whether a server's commits reach the disk before they are acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerDurability {
    /// `fsync`, `synchronous_commit` and `full_page_writes` on, as a user
    /// runs PostgreSQL: what benchmarks measure.
    Durable,
    /// All three off: fast, and acceptable only for a cluster that is thrown
    /// away after the tests.
    Throwaway,
}

/// A running throw-away cluster.
#[derive(Debug)]
pub struct PostgresServer {
    directory: TempDir,
    durability: ServerDurability,
    bin_dir: PathBuf,
    /// `Some("postgres")` when server commands run as that OS user.
    os_user: Option<&'static str>,
    port: u16,
    watchdog: Option<Child>,
    databases_created: AtomicU64,
    /// The certificates of a server started with TLS.
    tls: Option<TestCertificates>,
}

/// A fresh, empty database on a [`PostgresServer`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestDatabase {
    pub name: String,
    pub url: String,
    /// The test CA, on a server started with TLS.
    pub ca_file: Option<PathBuf>,
}

impl TestDatabase {
    /// A config for this database with every setting at its default; on a
    /// TLS server, `verify-full` against the test CA.
    pub fn config(&self) -> PostgresConfig {
        PostgresConfig {
            ssl_mode: if self.ca_file.is_some() {
                SslMode::VerifyFull
            } else {
                SslMode::Disable
            },
            ca_file: self.ca_file.clone(),
            ..PostgresConfig::new(self.url.clone())
        }
    }

    /// A store on this database with the store's migrations and `extra` applied.
    pub async fn migrated_store(&self, policy: Policy, extra: &[Migration]) -> Result<PostgresStore, HarnessError> {
        let store =
            PostgresStore::new(&self.config(), policy).map_err(|error| HarnessError::Store(error.to_string()))?;
        store.migrate(extra).await?;
        Ok(store)
    }
}

/// Runs `requests` as one claim batch, as if they had all arrived while the
/// previous batch was in flight, and then finishes each claim, in order, on
/// the path its batch outcome chose, as [`PostgresStore`]'s `claim` does.
/// Returns what the batch decided for each claim and the claim's outcome:
/// the tests' way to put chosen claims (the same key twice, conflicting
/// rows) into one batch, which concurrent calls do only by chance.
pub async fn claim_in_one_batch(
    store: &PostgresStore,
    requests: &[ClaimRequest],
) -> Vec<(BatchedClaim, Result<ClaimOutcome, StoreError>)> {
    let items = requests
        .iter()
        .map(|request| ClaimItem {
            slot: Slot::new(&request.caller, &request.key),
            request: request.clone(),
            policy: *store.policy(),
        })
        .collect();
    let runner = ClaimBatchRunner {
        pool: store.pool().clone(),
        operation_timeout: store.operation_timeout,
    };
    let batched = runner.run(items).await;
    assert_eq!(batched.len(), requests.len(), "one outcome per claim");
    let mut outcomes = Vec::with_capacity(requests.len());
    for (request, batched) in requests.iter().zip(batched) {
        let outcome = store.finish_claim(request, batched.clone()).await;
        outcomes.push((batched, outcome));
    }
    outcomes
}

/// One completion for [`complete_with_rows_in_one_batch`].
#[derive(Debug)]
pub struct BatchCompletion {
    pub lease: HeldLease,
    pub response: SavedResponse,
    pub row: OwnedRowEffect,
}

/// Runs `completions` as one completion batch, as if they had all arrived
/// while the previous batch was in flight, and then finishes each, in
/// order, on the path its batch outcome chose, as
/// [`PostgresStore::complete_with_row_in_batch`] does. Returns what the
/// batch decided for each ([`crate::BatchedCompletion::kind`]) and its outcome.
pub async fn complete_with_rows_in_one_batch(
    store: &PostgresStore,
    completions: Vec<BatchCompletion>,
) -> Vec<(&'static str, Result<RowCompletion, StoreError>)> {
    let finishing: Vec<(HeldLease, SavedResponse)> = completions
        .iter()
        .map(|completion| (completion.lease.clone(), completion.response.clone()))
        .collect();
    let items = completions
        .into_iter()
        .map(|completion| {
            CompletionItem::new(
                &completion.lease,
                completion.response,
                *store.policy(),
                CompletionEffect::Row(completion.row),
            )
        })
        .collect();
    let runner = CompletionBatchRunner {
        pool: store.pool().clone(),
        operation_timeout: store.operation_timeout,
    };
    let batched = runner.run(items).await;
    assert_eq!(batched.len(), finishing.len(), "one outcome per completion");
    let mut outcomes = Vec::with_capacity(finishing.len());
    for ((lease, response), batched) in finishing.iter().zip(batched) {
        let kind = batched.kind();
        outcomes.push((kind, store.finish_completion(lease, response, batched).await));
    }
    outcomes
}

/// Runs plain completions (`complete`) as one completion batch, then
/// finishes each, in order, on the path its batch outcome chose, as
/// `PostgresStore::complete` does (without waking waiters). Returns what
/// the batch decided for each and its outcome.
pub async fn complete_in_one_batch(
    store: &PostgresStore,
    completions: Vec<(HeldLease, SavedResponse)>,
) -> Vec<(&'static str, Result<Fenced, StoreError>)> {
    let items = completions
        .iter()
        .map(|(lease, response)| {
            CompletionItem::new(lease, response.clone(), *store.policy(), CompletionEffect::Nothing)
        })
        .collect();
    let runner = CompletionBatchRunner {
        pool: store.pool().clone(),
        operation_timeout: store.operation_timeout,
    };
    let batched = runner.run(items).await;
    assert_eq!(batched.len(), completions.len(), "one outcome per completion");
    let mut outcomes = Vec::with_capacity(completions.len());
    for ((lease, response), batched) in completions.iter().zip(batched) {
        let kind = batched.kind();
        outcomes.push((kind, store.finish_complete(lease, response, batched).await));
    }
    outcomes
}

impl PostgresServer {
    /// Makes a throw-away cluster (no fsync) in a temporary directory and
    /// starts it; blocks until it accepts connections.
    pub fn start() -> Result<Self, HarnessError> {
        Self::start_with(ServerDurability::Throwaway)
    }

    /// As [`PostgresServer::start`], with the durability given.
    pub fn start_with(durability: ServerDurability) -> Result<Self, HarnessError> {
        Self::start_with_tls(durability, false)
    }

    /// A throw-away cluster with `ssl = on`, a server certificate for
    /// 127.0.0.1 and localhost signed by a CA the test generated
    /// ([`PostgresServer::certificates`]), and TCP connections accepted
    /// only over TLS.
    pub fn start_tls() -> Result<Self, HarnessError> {
        Self::start_with_tls(ServerDurability::Throwaway, true)
    }

    fn start_with_tls(durability: ServerDurability, tls: bool) -> Result<Self, HarnessError> {
        let bin_dir = find_bin_dir()?;
        let directory = tempfile::Builder::new()
            .prefix("idem-postgres-")
            .tempdir()
            .map_err(io_error("create a temporary directory"))?;
        let os_user = running_as_root()?.then_some(SERVER_OS_USER);
        if let Some(user) = os_user {
            run(Command::new("chown").arg(format!("{user}:")).arg(directory.path()))?;
        }
        let mut server = Self {
            directory,
            durability,
            bin_dir,
            os_user,
            port: 0,
            watchdog: None,
            databases_created: AtomicU64::new(0),
            tls: None,
        };
        server.init_cluster()?;
        if tls {
            server.tls = Some(server.configure_tls()?);
        }
        server.start_on_a_free_port()?;
        server.watchdog = Some(server.spawn_watchdog()?);
        Ok(server)
    }

    /// One server for the whole test process, started on first use.
    ///
    /// # Panics
    /// When the server cannot start: there is nothing a test can do then.
    pub fn shared() -> &'static PostgresServer {
        static SHARED: OnceLock<PostgresServer> = OnceLock::new();
        SHARED.get_or_init(|| match PostgresServer::start() {
            Ok(server) => server,
            Err(error) => panic!("could not start the test PostgreSQL server: {error}"),
        })
    }

    /// One TLS server ([`PostgresServer::start_tls`]) for the whole test
    /// process, started on first use.
    ///
    /// # Panics
    /// When the server cannot start.
    pub fn shared_tls() -> &'static PostgresServer {
        static SHARED_TLS: OnceLock<PostgresServer> = OnceLock::new();
        SHARED_TLS.get_or_init(|| match PostgresServer::start_tls() {
            Ok(server) => server,
            Err(error) => panic!("could not start the test PostgreSQL server with TLS: {error}"),
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The certificates of a server started with [`PostgresServer::start_tls`].
    pub fn certificates(&self) -> Option<&TestCertificates> {
        self.tls.as_ref()
    }

    /// The temporary directory holding the cluster, its socket and its log.
    pub fn directory(&self) -> &Path {
        self.directory.path()
    }

    /// The server's log so far, for a failing test to print.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_file()).unwrap_or_default()
    }

    /// The URL of `database` on this server.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://{SUPERUSER}@127.0.0.1:{}/{database}", self.port)
    }

    /// Crashes the server as a power cut would look to its clients:
    /// `pg_ctl stop -m immediate` (no checkpoint, connections dropped), so
    /// the next start replays the WAL. Committed transactions survive only
    /// on a [`ServerDurability::Durable`] server.
    pub fn shut_down_immediately(&self) -> Result<(), HarnessError> {
        run(&mut self.pg_ctl_stop()).map(drop)
    }

    /// Starts the server again, after [`PostgresServer::shut_down_immediately`], on the same port and data directory.
    pub fn start_again(&self) -> Result<(), HarnessError> {
        run(&mut self.pg_ctl_start()).map(drop)
    }

    /// Creates a new empty database with a unique name.
    pub async fn create_database(&self) -> Result<TestDatabase, HarnessError> {
        let number = self.databases_created.fetch_add(1, Ordering::Relaxed);
        let name = format!("idem_test_{number}_{:08x}", rand::random::<u32>());
        let (client, connection) = tokio_postgres::connect(&self.admin_url(), tokio_postgres::NoTls).await?;
        let driver = tokio::spawn(connection);
        let created = client.batch_execute(&format!("CREATE DATABASE {name}")).await;
        drop(client);
        // The connection task ends once the client is gone; its own error,
        // if any, is the one `created` already reports.
        let _ = driver.await;
        created?;
        Ok(TestDatabase {
            url: self.url(&name),
            name,
            ca_file: self.tls.as_ref().map(|certificates| certificates.ca_file.clone()),
        })
    }

    /// Where the harness itself connects: over TCP, or through the Unix
    /// socket on a TLS server, whose TCP port takes TLS connections only.
    fn admin_url(&self) -> String {
        match self.tls {
            None => self.url("postgres"),
            Some(_) => format!(
                "host={} port={} user={SUPERUSER} dbname=postgres",
                self.directory.path().display(),
                self.port
            ),
        }
    }

    /// Writes test certificates into the cluster's directory (owned by the
    /// server's OS user: PostgreSQL refuses a key file others may read),
    /// turns `ssl` on and allows TCP connections only with TLS (`hostssl`).
    fn configure_tls(&self) -> Result<TestCertificates, HarnessError> {
        let tls_dir = self.directory.path().join("tls");
        std::fs::create_dir(&tls_dir).map_err(io_error("create the TLS directory"))?;
        let certificates = TestCertificates::generate(&tls_dir).map_err(io_error("generate test certificates"))?;
        if let Some(user) = self.os_user {
            run(Command::new("chown").arg("-R").arg(format!("{user}:")).arg(&tls_dir))?;
        }
        let settings = format!(
            "\nssl = on\nssl_cert_file = '{}'\nssl_key_file = '{}'\n",
            certificates.server_cert_file.display(),
            certificates.server_key_file.display()
        );
        append(&self.data_dir().join("postgresql.conf"), &settings)?;
        std::fs::write(self.data_dir().join("pg_hba.conf"), TLS_ONLY_HBA).map_err(io_error("write pg_hba.conf"))?;
        Ok(certificates)
    }

    fn data_dir(&self) -> PathBuf {
        self.directory.path().join("data")
    }

    fn log_file(&self) -> PathBuf {
        self.directory.path().join("server.log")
    }

    /// A command for a server binary, run as the cluster's OS user.
    fn server_command(&self, program: &str) -> Command {
        let binary = self.bin_dir.join(program);
        let mut command = match self.os_user {
            Some(user) => {
                let mut command = Command::new("runuser");
                command.args(["-u", user, "--"]).arg(binary);
                command
            }
            None => Command::new(binary),
        };
        // The OS user may not be allowed into the caller's directory.
        command.current_dir(self.directory.path()).stdin(Stdio::null());
        command
    }

    /// The data directory: a copy of the template cluster (`cp -a` keeps
    /// its owner and the 0700 mode PostgreSQL insists on).
    fn init_cluster(&self) -> Result<(), HarnessError> {
        let template = self.template_cluster()?;
        run(Command::new("cp").arg("-a").arg(&template).arg(self.data_dir())).map(drop)
    }

    /// `initdb` into `data_dir`.
    fn run_initdb(&self, data_dir: &Path) -> Result<(), HarnessError> {
        let mut initdb = self.server_command("initdb");
        initdb
            .arg("--pgdata")
            .arg(data_dir)
            .args(["--username", SUPERUSER, "--auth", "trust", "--encoding", "UTF8"])
            .args(["--locale", "C", "--no-sync", "--no-instructions"]);
        run(&mut initdb).map(drop)
    }

    /// The template cluster of this PostgreSQL build and OS user, made by
    /// `initdb` the first time. It is made beside its place and renamed
    /// there, so a half-made one is never copied; processes that race each
    /// make one and the first rename wins. One owned by another user is
    /// never used.
    fn template_cluster(&self) -> Result<PathBuf, HarnessError> {
        let owner = std::fs::metadata(self.directory.path())
            .map_err(io_error("read the server directory"))?
            .uid();
        let postgres =
            std::fs::metadata(self.bin_dir.join("postgres")).map_err(io_error("read the postgres binary"))?;
        let build = format!("{}:{}:{}", self.bin_dir.display(), postgres.len(), postgres.mtime());
        let name = format!(
            "{TEMPLATE_DIRECTORY_PREFIX}{:016x}-{owner}-{TEMPLATE_FORMAT}",
            fnv1a(build.as_bytes())
        );
        let parent = std::env::temp_dir();
        let template = parent.join(name);
        if let Ok(metadata) = std::fs::metadata(template.join("PG_VERSION")) {
            if metadata.uid() == owner {
                return Ok(template);
            }
            return Err(HarnessError::Command {
                command: format!("use the template cluster {}", template.display()),
                output: format!("it belongs to uid {}, not {owner}", metadata.uid()),
            });
        }
        let making = tempfile::Builder::new()
            .prefix(".idem-postgres-template-")
            .tempdir_in(&parent)
            .map_err(io_error("create a folder for the template cluster"))?;
        if let Some(user) = self.os_user {
            run(Command::new("chown").arg(format!("{user}:")).arg(making.path()))?;
        }
        let made = making.path().join("data");
        self.run_initdb(&made)?;
        match std::fs::rename(&made, &template) {
            Ok(()) => Ok(template),
            // Another process renamed its own first.
            Err(_) if template.join("PG_VERSION").is_file() => Ok(template),
            Err(error) => Err(io_error(format!(
                "rename the template cluster to {}",
                template.display()
            ))(error)),
        }
    }

    fn start_on_a_free_port(&mut self) -> Result<(), HarnessError> {
        let mut last_error = None;
        for _ in 0..SERVER_START_ATTEMPTS {
            self.port = free_port()?;
            match run(&mut self.pg_ctl_start()) {
                Ok(_) => return Ok(()),
                Err(error) => last_error = Some(error),
            }
        }
        let log = std::fs::read_to_string(self.log_file()).unwrap_or_default();
        let detail = last_error.map(|error| error.to_string()).unwrap_or_default();
        Err(HarnessError::Command {
            command: "pg_ctl start".to_owned(),
            output: format!("{detail}\nserver log:\n{log}"),
        })
    }

    /// `fsync=off` and friends trade durability for speed: acceptable for a
    /// cluster that is thrown away after the tests, never for a benchmark.
    fn pg_ctl_start(&self) -> Command {
        let durability = match self.durability {
            ServerDurability::Durable => "-c fsync=on -c synchronous_commit=on -c full_page_writes=on",
            ServerDurability::Throwaway => "-c fsync=off -c synchronous_commit=off -c full_page_writes=off",
        };
        let options = format!(
            "-c port={} -c listen_addresses=127.0.0.1 -c unix_socket_directories='{}' \
             -c max_connections={SERVER_CONNECTIONS_MAX} {durability} {}",
            self.port,
            self.directory.path().display(),
            std::env::var(EXTRA_OPTIONS_VARIABLE).unwrap_or_default(),
        );
        let mut command = self.server_command("pg_ctl");
        command
            .arg("start")
            .arg("--pgdata")
            .arg(self.data_dir())
            .arg("--log")
            .arg(self.log_file())
            .args([
                "--wait",
                "--timeout",
                &SERVER_START_TIMEOUT_S.to_string(),
                "-o",
                &options,
            ]);
        command
    }

    fn pg_ctl_stop(&self) -> Command {
        let mut command = self.server_command("pg_ctl");
        command
            .arg("stop")
            .arg("--pgdata")
            .arg(self.data_dir())
            .args(["--mode", "immediate", "--wait"]);
        command
    }

    /// Stops the server and removes its directory once this process is gone.
    fn spawn_watchdog(&self) -> Result<Child, HarnessError> {
        let script = format!(
            r#"while kill -0 "$1" 2>/dev/null; do sleep {WATCHDOG_POLL_S}; done
if [ -n "$5" ]; then runuser -u "$5" -- "$4" stop -D "$2" -m immediate; else "$4" stop -D "$2" -m immediate; fi
rm -rf "$3""#
        );
        Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg("idem-postgres-watchdog")
            .arg(std::process::id().to_string())
            .arg(self.data_dir())
            .arg(self.directory.path())
            .arg(self.bin_dir.join("pg_ctl"))
            .arg(self.os_user.unwrap_or_default())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own process group, so a Ctrl-C aimed at the tests does not
            // end the watchdog before it has cleaned up.
            .process_group(0)
            .spawn()
            .map_err(io_error("start the server watchdog"))
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        if let Err(error) = run(&mut self.pg_ctl_stop()) {
            eprintln!("stopping the test PostgreSQL server failed: {error}");
        }
        if let Some(mut watchdog) = self.watchdog.take() {
            // The watchdog is this process's own child: end it by its id.
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
    }
}

fn append(path: &Path, text: &str) -> Result<(), HarnessError> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .map_err(io_error(format!("open {}", path.display())))?;
    file.write_all(text.as_bytes())
        .map_err(io_error(format!("write {}", path.display())))
}

/// FNV-1a, 64 bits: a name for a PostgreSQL build that stays the same
/// from one compiler to the next (std's hasher may not).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn running_as_root() -> Result<bool, HarnessError> {
    let metadata = std::fs::metadata("/proc/self").map_err(io_error("read /proc/self"))?;
    Ok(metadata.uid() == 0)
}

/// The folder named by `IDEM_POSTGRES_BIN_DIR`, else the newest of Debian's
/// `/usr/lib/postgresql/<version>/bin`.
fn find_bin_dir() -> Result<PathBuf, HarnessError> {
    if let Some(dir) = std::env::var_os(BIN_DIR_VARIABLE) {
        let dir = PathBuf::from(dir);
        return has_server_binaries(&dir)
            .then_some(dir)
            .ok_or_else(|| HarnessError::NotInstalled(format!("{BIN_DIR_VARIABLE} has no initdb")));
    }
    let entries = std::fs::read_dir(DEBIAN_POSTGRESQL_DIR)
        .map_err(|error| HarnessError::NotInstalled(format!("{DEBIAN_POSTGRESQL_DIR}: {error}")))?;
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version: u32 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            has_server_binaries(&bin).then_some((version, bin))
        })
        .max_by_key(|(version, _)| *version)
        .map(|(_, bin)| bin)
        .ok_or_else(|| HarnessError::NotInstalled(format!("no {DEBIAN_POSTGRESQL_DIR}/<version>/bin/initdb")))
}

fn has_server_binaries(dir: &Path) -> bool {
    ["initdb", "pg_ctl", "postgres"]
        .iter()
        .all(|name| dir.join(name).is_file())
}

fn free_port() -> Result<u16, HarnessError> {
    test_support::free_loopback_port().map_err(io_error("find a free port"))
}

fn run(command: &mut Command) -> Result<Output, HarnessError> {
    let shown = format!("{command:?}");
    let output = command.output().map_err(io_error(format!("run {shown}")))?;
    if output.status.success() {
        return Ok(output);
    }
    Err(HarnessError::Command {
        command: shown,
        output: format!(
            "{}\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    })
}
