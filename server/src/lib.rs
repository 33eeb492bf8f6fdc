//! The Label service over HTTP: an idempotency layer any axum
//! route can wear, a handler-level API for routes whose effect must commit
//! with the key, a carrier simulator, config-selected backends, and
//! Prometheus metrics.
//!
//! Map of the crate, from the top down; a module imports only from below it:
//! - [`app`]: the router, starting and stopping; [`config`]: loading the
//!   TOML file and its `IDEM__` environment overrides, and assembling the
//!   sections, each of which its owner defines and checks ([`serving`]
//!   `[server]`, [`admission`], [`tls`], [`auth`] `[[callers]]`,
//!   [`carrier`], [`sweeper`]; `[store]` is the store-registry crate's).
//! - [`forget`]: `server forget-unreadable-record`, the operator's command for an unreadable record.
//! - [`openapi`], [`probes`], [`connections`] (header-read timeout, connection cap, draining).
//! - [`state`]: what every handler reads; [`readiness`]: the stores' readiness as last checked.
//! - [`backend`]: the record store `store.kind` names (opened by the
//!   store-registry crate, the one list of kinds) and the label store beside it.
//! - [`labels`]: the label route and where labels live, per backend; [`carrier`]: the carrier client and simulator.
//! - [`idempotency`]: the idempotency middleware (the idem-http crate's
//!   layer and [`idempotency::Attempt`] API), configured for this service.
//! - [`limits`], [`body_read`] (the body before admission), [`admission`], [`observe`], [`auth`], [`media_type`], [`sweeper`], [`instrumented`].
//! - At the bottom: [`metrics`] (names, given its label sets), [`error`]
//!   (the one API error type, RFC 9457 problem details), [`setting`] (the
//!   configuration's refusal type), [`request_context`], [`time`],
//!   [`failpoints`] (crash points in the label create path; feature `failpoints`, tests only).
//! - [`redact`]: hides passwords in URLs in errors and `Debug` forms (store-core's).

pub mod admission;
pub mod app;
pub mod auth;
pub mod backend;
pub mod body_read;
pub mod carrier;
pub mod config;
pub mod connections;
pub mod error;
pub mod failpoints;
pub mod forget;
pub mod idempotency;
pub mod instrumented;
pub mod labels;
pub mod limits;
pub mod media_type;
pub mod metrics;
pub mod observe;
pub mod openapi;
pub mod probes;
pub mod readiness;
/// One redaction of secrets for the server's messages and every backend's `Debug` form (store-core's).
pub use store_core::redact;
pub mod request_context;
pub mod serving;
pub mod setting;
pub mod state;
pub mod sweeper;
pub mod time;
pub mod tls;

pub use app::{App, RunningServer, StartupError, router};
pub use config::Config;
/// The `Idempotency-Key` header's parser and limits (idem-http's), which
/// the OpenAPI document publishes.
pub use idem_http::key_header;
pub use state::AppState;
