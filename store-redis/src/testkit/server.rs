//! One real redis-server on a free loopback port in a temporary directory.

use super::HarnessError;
use crate::config::{RedisConfig, RedisTls};
use std::fs;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::thread::sleep;
use std::time::{Duration, Instant};
use tempfile::TempDir;
use test_support::child::TiedCommand;
use test_support::tls::TestCertificates;

/// Whether a TLS server asks clients for a certificate (`--tls-auth-clients`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// A client may connect without a certificate.
    Optional,
    /// A client without a certificate signed by the test CA is refused.
    Required,
}

/// A TLS setup for test servers: certificates generated for the test (a
/// CA, a server certificate for 127.0.0.1, a client certificate) in a
/// directory that lives as long as any server using it.
#[derive(Debug, Clone)]
pub struct TlsSetup {
    pub certificates: TestCertificates,
    pub client_auth: ClientAuth,
    _directory: Arc<TempDir>,
}

impl TlsSetup {
    /// Generates fresh certificates in a temporary directory.
    pub fn generate(client_auth: ClientAuth) -> Result<Self, HarnessError> {
        let directory = tempfile::Builder::new().prefix("idem-redis-tls-").tempdir()?;
        let certificates = TestCertificates::generate(directory.path())?;
        Ok(Self {
            certificates,
            client_auth,
            _directory: Arc::new(directory),
        })
    }

    /// The redis-server arguments that serve TLS on `port` and no plain TCP.
    fn server_args(&self, port: u16) -> Vec<String> {
        let certificates = &self.certificates;
        let auth = match self.client_auth {
            ClientAuth::Optional => "optional",
            ClientAuth::Required => "yes",
        };
        [
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--tls-cert-file",
            &certificates.server_cert_file.to_string_lossy(),
            "--tls-key-file",
            &certificates.server_key_file.to_string_lossy(),
            "--tls-ca-cert-file",
            &certificates.ca_file.to_string_lossy(),
            "--tls-auth-clients",
            auth,
        ]
        .iter()
        .map(|arg| (*arg).to_owned())
        .collect()
    }

    /// The store's TLS settings: the test CA, and the client certificate
    /// when the server requires one.
    pub fn store_tls(&self) -> RedisTls {
        let client = self.client_auth == ClientAuth::Required;
        RedisTls {
            ca_file: Some(self.certificates.ca_file.clone()),
            client_cert_file: client.then(|| self.certificates.client_cert_file.clone()),
            client_key_file: client.then(|| self.certificates.client_key_file.clone()),
        }
    }

    /// What the harness's own connections present: the CA and, always, the
    /// client certificate (a server that does not ask ignores it).
    fn harness_certificates(&self) -> Result<redis::TlsCertificates, std::io::Error> {
        Ok(redis::TlsCertificates {
            client_tls: Some(redis::ClientTlsConfig {
                client_cert: fs::read(&self.certificates.client_cert_file)?,
                client_key: fs::read(&self.certificates.client_key_file)?,
            }),
            root_cert: Some(fs::read(&self.certificates.ca_file)?),
        })
    }

    /// `redis-cli` arguments for a TLS connection with the harness's certificates.
    pub(crate) fn cli_args(&self) -> Vec<String> {
        let certificates = &self.certificates;
        vec![
            "--tls".to_owned(),
            "--cacert".to_owned(),
            certificates.ca_file.to_string_lossy().into_owned(),
            "--cert".to_owned(),
            certificates.client_cert_file.to_string_lossy().into_owned(),
            "--key".to_owned(),
            certificates.client_key_file.to_string_lossy().into_owned(),
        ]
    }
}

/// The server binary, looked up on PATH (Debian's `redis-server` package).
pub const REDIS_SERVER_PROGRAM: &str = "redis-server";
/// The client binary (Debian's `redis-tools` package).
pub const REDIS_CLI_PROGRAM: &str = "redis-cli";
/// Longest wait for a started server to answer.
pub const STARTUP_MS_MAX: u64 = 5_000;
/// Pause between readiness probes.
const PROBE_INTERVAL_MS: u64 = 10;
/// Fresh ports tried when a server cannot bind the first one (another
/// process took it between our probe and the server's bind).
const START_ATTEMPTS_MAX: usize = 3;
/// Bytes of the server log shown when it fails to start.
const LOG_TAIL_BYTES_MAX: usize = 2_000;

/// A redis-server child process. Killed (SIGKILL) when dropped.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    extra_args: Vec<String>,
    tls: Option<TlsSetup>,
    dir: TempDir,
}

impl RedisServer {
    /// `redis-server --port P --bind 127.0.0.1 --save '' --appendonly no --dir TMP`.
    pub fn start() -> Result<Self, HarnessError> {
        Self::start_with_args::<&str>(&[])
    }

    /// As [`RedisServer::start`], then `extra_args`, which override the
    /// defaults: e.g. `["--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru"]`
    /// or `["--appendonly", "yes"]`.
    pub fn start_with_args<S: AsRef<str>>(extra_args: &[S]) -> Result<Self, HarnessError> {
        Self::start_with(extra_args, None)
    }

    /// A server that speaks TLS only (`--port 0 --tls-port P`), with the
    /// certificates of `tls`; its [`RedisServer::url`] is `rediss://`.
    pub fn start_tls(tls: TlsSetup) -> Result<Self, HarnessError> {
        Self::start_with::<&str>(&[], Some(tls))
    }

    /// As [`RedisServer::start_with_args`], over TLS when `tls` is given.
    pub fn start_with<S: AsRef<str>>(extra_args: &[S], tls: Option<TlsSetup>) -> Result<Self, HarnessError> {
        let extra_args: Vec<String> = extra_args.iter().map(|arg| arg.as_ref().to_owned()).collect();
        let mut last_error = None;
        for _ in 0..START_ATTEMPTS_MAX {
            let mut server = Self {
                child: None,
                port: free_port()?,
                extra_args: extra_args.clone(),
                tls: tls.clone(),
                dir: tempfile::Builder::new().prefix("idem-redis-").tempdir()?,
            };
            match server.spawn_and_wait() {
                Ok(()) => return Ok(server),
                Err(error @ HarnessError::Exited { .. }) => last_error = Some(error),
                Err(error) => return Err(error),
            }
        }
        Err(last_error.unwrap_or_else(|| HarnessError::Io(std::io::Error::other("no start attempt was made"))))
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`, or `rediss://` for a TLS server.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// The TLS setup of a TLS server.
    pub fn tls(&self) -> Option<&TlsSetup> {
        self.tls.as_ref()
    }

    /// The server's working directory, kept across restarts.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A store configuration for this server (trusting the test CA, with
    /// the client certificate if the server requires one), every other
    /// setting at its default.
    pub fn config(&self) -> RedisConfig {
        RedisConfig {
            tls: self.tls.as_ref().map(TlsSetup::store_tls).unwrap_or_default(),
            ..RedisConfig::standalone(self.url())
        }
    }

    /// The process id while the server runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server at once (SIGKILL): no shutdown save, no goodbye to clients.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server if it runs, then starts it again on the same port,
    /// in the same directory, with the same arguments.
    pub fn restart(&mut self) -> Result<(), HarnessError> {
        self.kill();
        self.spawn_and_wait()
    }

    /// Freezes the process (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self) -> Result<(), HarnessError> {
        self.signal("-STOP")
    }

    /// Thaws a paused process (SIGCONT); it then runs what it had received.
    pub fn resume(&self) -> Result<(), HarnessError> {
        self.signal("-CONT")
    }

    /// Runs one command on a fresh blocking connection, for test setup and
    /// for looking behind the store's back.
    pub fn query<T: redis::FromRedisValue>(&self, args: &[&str]) -> redis::RedisResult<T> {
        let client = match &self.tls {
            Some(tls) => redis::Client::build_with_tls(self.url(), tls.harness_certificates()?)?,
            None => redis::Client::open(self.url())?,
        };
        let mut connection = client.get_connection_with_timeout(Duration::from_millis(STARTUP_MS_MAX))?;
        let mut command = redis::cmd(args.first().copied().unwrap_or("PING"));
        for arg in args.iter().skip(1) {
            command.arg(*arg);
        }
        command.query(&mut connection)
    }

    fn signal(&self, signal: &str) -> Result<(), HarnessError> {
        let Some(pid) = self.pid() else {
            return Ok(());
        };
        let status = Command::new("kill")
            .arg(signal)
            .arg(pid.to_string())
            .status()
            .map_err(|source| HarnessError::Spawn {
                program: "kill",
                source,
            })?;
        if status.success() {
            Ok(())
        } else {
            Err(HarnessError::Io(std::io::Error::other(format!(
                "kill {signal} {pid}: {status}"
            ))))
        }
    }

    fn spawn_and_wait(&mut self) -> Result<(), HarnessError> {
        let dir = self.dir.path().to_string_lossy().into_owned();
        let log = self.dir.path().join("redis.log");
        let port_args = match &self.tls {
            Some(tls) => tls.server_args(self.port),
            None => vec!["--port".to_owned(), self.port.to_string()],
        };
        // Tied to this process: a killed bench or test binary takes its
        // redis-server with it (test-support's child module).
        let mut server = TiedCommand::new(REDIS_SERVER_PROGRAM);
        server
            .command()
            .args(&port_args)
            .args(["--bind", "127.0.0.1", "--daemonize", "no"])
            .args(["--save", "", "--appendonly", "no", "--dir", &dir])
            .args(["--logfile", &log.to_string_lossy()])
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = server.spawn().map_err(|source| HarnessError::Spawn {
            program: REDIS_SERVER_PROGRAM,
            source,
        })?;
        self.child = Some(child);
        self.wait_until_ready()
    }

    fn wait_until_ready(&mut self) -> Result<(), HarnessError> {
        let deadline = Instant::now() + Duration::from_millis(STARTUP_MS_MAX);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && child.try_wait()?.is_some()
            {
                self.child = None;
                return Err(HarnessError::Exited {
                    port: self.port,
                    log: self.log_tail(),
                });
            }
            if self.answers_as_itself() {
                return Ok(());
            }
            sleep(Duration::from_millis(PROBE_INTERVAL_MS));
        }
        self.kill();
        Err(HarnessError::NotReady {
            port: self.port,
            log: self.log_tail(),
        })
    }

    /// True when the process listening on our port is our child: a server
    /// that lost a race for the port must not pass for ready because
    /// another one answers there.
    fn answers_as_itself(&self) -> bool {
        let Some(pid) = self.pid() else {
            return false;
        };
        let expected = format!("process_id:{pid}");
        self.query::<String>(&["INFO", "server"])
            .is_ok_and(|info| info.lines().any(|line| line.trim_end() == expected))
    }

    /// The end of the server's log, for error messages.
    pub fn log_tail(&self) -> String {
        let text = fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default();
        let start = text.len().saturating_sub(LOG_TAIL_BYTES_MAX);
        text.get(start..).unwrap_or(&text).to_owned()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A loopback port nothing listens on right now, below the ephemeral range.
pub(crate) fn free_port() -> Result<u16, HarnessError> {
    Ok(test_support::free_loopback_port()?)
}
