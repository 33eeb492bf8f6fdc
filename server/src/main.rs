//! `server`: the Label service, or the carrier simulator on its own.
//!
//! ```text
//! server [--config FILE]                           serve the Label service
//! server --version                                 the version and the features built in
//! server carrier --listen 127.0.0.1:9090           serve the carrier simulator
//! server hash-token < token.txt                    print a token's SHA-256 for [[callers]]
//! server hash-token --token-file token.txt         the same, from a file
//! server forget-unreadable-record --caller C --key-sha256 HEX
//!                                                  delete one unreadable record (or --key KEY)
//! ```

use clap::{ArgGroup, Parser, Subcommand};
use server::auth::AUTHORIZATION_BYTES_MAX;
use server::auth::token_sha256;
use server::carrier::CarrierServer;
use server::config::{Config, LogConfig, LogFormat};
use server::forget::{KeyNamed, RecordName, RecordNameError};
use server::redact::redact_secrets;
use server::{App, StartupError};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use store_core::ForgetOutcome;
use tracing_subscriber::EnvFilter;

/// mimalloc instead of glibc's malloc: the request path allocates and frees
/// many small buffers on several threads, where glibc's consolidation and
/// free-list work cost about a sixth of the service's CPU under load.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The cargo features a build may have, as `server --version` names them:
/// packaging and operators check what a binary can do before they run it
/// (a `store.kind` it was built without is refused at startup).
const FEATURES_BUILT_IN: [(bool, &str); 3] = [
    (cfg!(feature = "foundationdb"), "foundationdb"),
    (cfg!(feature = "failpoints"), "failpoints"),
    (cfg!(feature = "memory-store"), "memory-store"),
];

/// `server --version`: the crate's version and the features built in.
fn version_text() -> &'static str {
    static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| {
        let features: Vec<&str> = FEATURES_BUILT_IN
            .iter()
            .filter(|(built_in, _)| *built_in)
            .map(|(_, name)| *name)
            .collect();
        let features = if features.is_empty() {
            "none".to_owned()
        } else {
            features.join(", ")
        };
        format!("{} (features: {features})", env!("CARGO_PKG_VERSION"))
    })
}

#[derive(Parser)]
#[command(name = "server", about = "idem's Label service", version = version_text())]
struct Cli {
    /// TOML config file; every field can also be set with IDEM__SECTION__FIELD.
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the Label service (the default).
    Serve,
    /// Serve the carrier simulator (settings from [carrier.simulator]).
    Carrier {
        #[arg(long, default_value = "127.0.0.1:9090")]
        listen: String,
    },
    /// Print the SHA-256 of a bearer token, for callers.token_sha256. The
    /// token is read from stdin (one line) or --token-file, never from the
    /// command line, where ps and the shell history would keep it.
    HashToken {
        /// Read the token from this file instead of stdin.
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// Refused: only here to say so without echoing the token.
        #[arg(hide = true, num_args = 0.., allow_hyphen_values = true)]
        token_on_command_line: Vec<String>,
    },
    /// Delete the record of one key if, and only if, it cannot be decoded
    /// (the key answers 500 record_unreadable). Opens the store --config
    /// names; the embedded store only while no server runs on it. Exit 0:
    /// deleted or no record; 3: the record is readable (or in a newer
    /// build's format) and was kept; 2: bad input; 1: the store could not
    /// be opened or failed.
    #[command(group(ArgGroup::new("key_name").required(true).args(["key_sha256", "key"])))]
    ForgetUnreadableRecord {
        /// The caller id (`caller` in the log line).
        #[arg(long)]
        caller: String,
        /// The key's SHA-256 in hex (`key_sha256` in the log line).
        #[arg(long)]
        key_sha256: Option<String>,
        /// The key itself, hashed as the stores hash it. ps and the shell
        /// history keep it: prefer --key-sha256 for keys that may carry
        /// personal data.
        #[arg(long, allow_hyphen_values = true)]
        key: Option<String>,
    },
}

/// Exit code of a refused invocation (bad config, a TLS file or a store's
/// TLS that failed, bad input).
const REFUSED_EXIT_CODE: u8 = 2;
/// Exit code of `forget-unreadable-record` when the record is readable and
/// was kept.
const FORGET_REFUSED_READABLE_EXIT_CODE: u8 = 3;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let command = cli.command.unwrap_or(Command::Serve);
    if let Command::HashToken {
        token_file,
        token_on_command_line,
    } = &command
    {
        return hash_token(token_file.as_deref(), token_on_command_line);
    }
    // The record's name is checked before the config is read or any store
    // opened, so bad input changes nothing.
    let forget_record = match &command {
        Command::ForgetUnreadableRecord {
            caller,
            key_sha256,
            key,
        } => match record_name(caller, key_sha256, key) {
            Ok(record) => Some(record),
            Err(reason) => {
                eprintln!("server forget-unreadable-record: {reason}; nothing was changed");
                return ExitCode::from(REFUSED_EXIT_CODE);
            }
        },
        _ => None,
    };
    let config = match Config::from_process(cli.config.as_deref()) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("server: refusing to start: {}", redact_secrets(&error.to_string()));
            return ExitCode::from(REFUSED_EXIT_CODE);
        }
    };
    init_tracing(&config.log);
    // The carrier simulator is a test double sharing the machine with the
    // service under test: one thread, so its calls cost no cross-thread
    // wake-ups (a profile of it on the multi-thread runtime spent a third
    // of its samples switching tasks between threads; BENCHMARKS.md, "The
    // carrier simulator's CPU").
    let mut builder = match command {
        Command::Carrier { .. } => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("server: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(record) = forget_record {
        return runtime.block_on(forget_unreadable_record(&config, &record));
    }
    let result = runtime.block_on(async move {
        match command {
            Command::Carrier { listen } => run_carrier(&config, &listen).await,
            Command::Serve | Command::HashToken { .. } | Command::ForgetUnreadableRecord { .. } => {
                run_server(config).await
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            let refused = error.is_refused_config();
            // Store errors may quote a URL; its password never reaches the output.
            let error = redact_secrets(&error.to_string());
            tracing::error!(%error, "server: refusing to start");
            eprintln!("server: {error}");
            if refused {
                ExitCode::from(REFUSED_EXIT_CODE)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// `server hash-token`: prints the digest of the token on stdin or in
/// `token_file`; refuses a token on the command line without echoing it.
fn hash_token(token_file: Option<&Path>, token_on_command_line: &[String]) -> ExitCode {
    if !token_on_command_line.is_empty() {
        eprintln!(
            "server hash-token: refusing a token on the command line (ps and the shell history keep it); \
             nothing was hashed. Pipe it on stdin (server hash-token < token.txt) or pass --token-file PATH"
        );
        return ExitCode::from(REFUSED_EXIT_CODE);
    }
    match read_token(token_file) {
        Ok(token) => {
            println!("{}", token_sha256(&token));
            ExitCode::SUCCESS
        }
        Err(reason) => {
            eprintln!("server hash-token: {reason}");
            ExitCode::from(REFUSED_EXIT_CODE)
        }
    }
}

/// The token: one line from `token_file` or stdin, its line ending removed.
/// A token longer than the server would read in an `Authorization` header,
/// an empty one, or more than one line is refused.
fn read_token(token_file: Option<&Path>) -> Result<String, String> {
    let mut input = Vec::new();
    let limit = AUTHORIZATION_BYTES_MAX as u64 + 1;
    let read = match token_file {
        Some(path) => std::fs::File::open(path)
            .and_then(|file| file.take(limit).read_to_end(&mut input))
            .map_err(|error| format!("cannot read {}: {error}", path.display())),
        None => std::io::stdin()
            .take(limit)
            .read_to_end(&mut input)
            .map_err(|error| format!("cannot read stdin: {error}")),
    };
    read?;
    if input.len() as u64 >= limit {
        return Err(format!("the token is longer than {AUTHORIZATION_BYTES_MAX} bytes"));
    }
    let text = String::from_utf8(input).map_err(|_| "the token is not UTF-8".to_owned())?;
    let token = text.strip_suffix('\n').unwrap_or(&text);
    let token = token.strip_suffix('\r').unwrap_or(token);
    if token.is_empty() {
        return Err("the token is empty (stdin or --token-file)".to_owned());
    }
    if token.contains(['\n', '\r']) {
        return Err("the token must be one line".to_owned());
    }
    Ok(token.to_owned())
}

/// The record named on the command line (clap refuses both key options
/// together, and neither).
fn record_name(caller: &str, key_sha256: &Option<String>, key: &Option<String>) -> Result<RecordName, RecordNameError> {
    let key = match (key_sha256, key) {
        (Some(hex_digits), _) => KeyNamed::Sha256(hex_digits),
        (None, Some(key)) => KeyNamed::Raw(key),
        (None, None) => return Err(RecordNameError::KeyMissing),
    };
    RecordName::parse(caller, key)
}

/// `server forget-unreadable-record`: one call to the store, its outcome
/// printed; see [`server::forget`].
async fn forget_unreadable_record(config: &Config, record: &RecordName) -> ExitCode {
    let store_kind = config.store.kind.name();
    match server::forget::forget_unreadable_record(config, record).await {
        Ok(outcome) => {
            let report = server::forget::report(outcome, record, store_kind);
            if matches!(outcome, ForgetOutcome::Readable | ForgetOutcome::NewerFormat) {
                eprintln!("server forget-unreadable-record: {report}");
                return ExitCode::from(FORGET_REFUSED_READABLE_EXIT_CODE);
            }
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            // Store errors may quote a URL; its password never reaches the output.
            eprintln!(
                "server forget-unreadable-record: {}",
                redact_secrets(&error.to_string())
            );
            ExitCode::FAILURE
        }
    }
}

fn init_tracing(log: &LogConfig) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&log.level));
    let colour = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stdout)
        .with_ansi(colour);
    let _ = match log.format {
        // Flat: the event's fields at the top level; the request's span
        // (request_id, trace_id) under `span`.
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

async fn run_server(config: Config) -> Result<(), StartupError> {
    let listen = config.listen_addr()?;
    let app = App::build_with_clock(config, server::failpoints::clock()).await?;
    let listener = server::app::listen(listen)?;
    tracing::info!("listening on {}://{}", app.scheme(), listener.local_addr()?);
    app.serve(listener, shutdown_signal()).await
}

async fn run_carrier(config: &Config, listen: &str) -> Result<(), StartupError> {
    let address = listen
        .parse()
        .map_err(|error| StartupError::Carrier(format!("--listen {listen:?} is not host:port: {error}")))?;
    let listener = server::app::listen(address)?;
    let server = CarrierServer::start(&config.carrier.simulator, listener)
        .await
        .map_err(|error| StartupError::Carrier(error.to_string()))?;
    tracing::info!("carrier simulator listening on {}", server.base_url());
    shutdown_signal().await;
    server.stop().await;
    Ok(())
}

/// Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
    tracing::info!("shutdown signal received: draining");
}
