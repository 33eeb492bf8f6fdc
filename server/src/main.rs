//! `server`: the Label service, or the carrier simulator on its own.
//!
//! ```text
//! server [--config FILE]                           serve the Label service
//! server carrier --listen 127.0.0.1:9090           serve the carrier simulator
//! server hash-token TOKEN                          print a token's SHA-256 for [[callers]]
//! ```

use clap::{Parser, Subcommand};
use server::carrier::CarrierServer;
use server::config::{Config, LogConfig, LogFormat, token_sha256};
use server::{App, StartupError};
use std::path::PathBuf;
use std::process::ExitCode;
use tracing_subscriber::EnvFilter;

/// mimalloc instead of glibc's malloc: the request path allocates and frees
/// many small buffers on several threads, where glibc's consolidation and
/// free-list work cost about a sixth of the service's CPU under load.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "server", about = "idem's Label service")]
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
    /// Print the SHA-256 of a bearer token, for callers.token_sha256.
    HashToken { token: String },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let command = cli.command.unwrap_or(Command::Serve);
    if let Command::HashToken { token } = &command {
        println!("{}", token_sha256(token));
        return ExitCode::SUCCESS;
    }
    let config = match Config::from_process(cli.config.as_deref()) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("server: refusing to start: {error}");
            return ExitCode::from(2);
        }
    };
    init_tracing(&config.log);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("server: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match command {
            Command::Carrier { listen } => run_carrier(&config, &listen).await,
            Command::Serve | Command::HashToken { .. } => run_server(config).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "server: refusing to start");
            eprintln!("server: {error}");
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
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

async fn run_server(config: Config) -> Result<(), StartupError> {
    let listen = config.listen_addr()?;
    let app = App::build(config).await?;
    let listener = server::app::listen(listen)?;
    tracing::info!("listening on http://{}", listener.local_addr()?);
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
