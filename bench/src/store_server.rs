//! `idem-bench store-server`: a redis-server or a PostgreSQL server started
//! by the stores' own harnesses (as `idem-bench http` starts them: Redis
//! with AOF everysec, PostgreSQL with fsync, synchronous_commit and
//! full_page_writes on, on a free loopback port below the ephemeral range,
//! in a temporary directory), kept until a SIGINT or SIGTERM, then stopped
//! and removed. Scripts that run several steps against one store
//! (`scripts/day-of-keys`) start it this way instead of starting a server
//! of their own.
//!
//! The store's URL is printed and written to `--url-file` once the server
//! accepts connections; the file appears whole (written beside it, then
//! renamed), so a script may wait for it to exist.

use crate::cli::BackendArgs;
use crate::interrupt;
use crate::store_mode::TargetError;
use clap::Args;
use std::path::{Path, PathBuf};
use store_registry::StoreKind;

/// `idem-bench store-server`.
#[derive(Debug, Clone, Args)]
pub struct StoreServerArgs {
    /// redis or postgres.
    #[arg(long, value_enum)]
    pub store_kind: StoreKind,
    /// Where to write the store's URL once it accepts connections.
    #[arg(long)]
    pub url_file: PathBuf,
    #[command(flatten)]
    pub backend: BackendArgs,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreServerError {
    #[error("store-server starts redis or postgres, not {0}")]
    Kind(&'static str),
    #[error(transparent)]
    Start(#[from] TargetError),
    #[error("writing {path}: {source}")]
    UrlFile { path: String, source: std::io::Error },
}

/// Starts the server, writes its URL, and holds it until asked to stop.
pub async fn run(args: &StoreServerArgs) -> Result<(), StoreServerError> {
    let (url, guard, note) = start(args).await?;
    write_url_file(&args.url_file, &url)?;
    println!("{url}");
    eprintln!(
        "store-server {}: {url} ({note}); SIGTERM or Ctrl-C stops it",
        args.store_kind.name()
    );
    interrupt::global().requested().await;
    drop(guard);
    let _ = std::fs::remove_file(&args.url_file);
    Ok(())
}

type Started = (String, Option<crate::store_mode::KeepAlive>, String);

#[cfg(feature = "postgres")]
async fn start_postgres(args: &BackendArgs) -> Result<Started, StoreServerError> {
    let address = crate::store_mode::postgres::database_for(args).await?;
    Ok((address.url, address.guard, address.note))
}

#[cfg(not(feature = "postgres"))]
async fn start_postgres(_: &BackendArgs) -> Result<Started, StoreServerError> {
    Err(StoreServerError::Kind("postgres (not built into this binary)"))
}

#[cfg(feature = "redis")]
fn start_redis(args: &BackendArgs) -> Result<Started, StoreServerError> {
    let address = crate::store_mode::redis::server_for(args)?;
    Ok((address.url, address.guard, address.note))
}

#[cfg(not(feature = "redis"))]
fn start_redis(_: &BackendArgs) -> Result<Started, StoreServerError> {
    Err(StoreServerError::Kind("redis (not built into this binary)"))
}

async fn start(args: &StoreServerArgs) -> Result<Started, StoreServerError> {
    match args.store_kind {
        StoreKind::Postgres => start_postgres(&args.backend).await,
        StoreKind::Redis => start_redis(&args.backend),
        other => Err(StoreServerError::Kind(other.name())),
    }
}

/// Written beside `path` and renamed onto it, so a reader never sees half
/// a URL.
fn write_url_file(path: &Path, url: &str) -> Result<(), StoreServerError> {
    let failed = |source| StoreServerError::UrlFile {
        path: path.display().to_string(),
        source,
    };
    let partial = path.with_extension("partial");
    std::fs::write(&partial, format!("{url}\n")).map_err(failed)?;
    std::fs::rename(&partial, path).map_err(failed)
}
