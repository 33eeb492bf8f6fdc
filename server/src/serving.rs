//! `[server]`: how the API is served (the listen address, the request
//! budget, the in-flight and connection caps, shutdown, `Retry-After`,
//! `Prefer: wait`), with its defaults, limits and validation. Its
//! `admission` and `tls` sections are their owners' (`admission.rs`,
//! `tls.rs`).

use crate::admission::AdmissionConfig;
use crate::body_read::{BODY_READ_TIMEOUT_MS_DEFAULT, BODY_READ_TIMEOUT_MS_MAX};
use crate::probes::{READINESS_REFRESH_MS_DEFAULT, READINESS_REFRESH_MS_MAX, READINESS_REFRESH_MS_MIN};
use crate::setting::{ConfigError, RETRY_AFTER_S_DEFAULT, RETRY_AFTER_S_MAX, check_range, field_error};
use crate::tls::ServerTlsConfig;
use serde::Deserialize;
use store_core::WaitLimits;
use store_core::waiting::{WAIT_POLL_INTERVAL_MS_DEFAULT, WAITERS_PER_KEY_MAX_DEFAULT};

/// Default listen address: loopback only, so a first run exposes nothing.
pub const LISTEN_DEFAULT: &str = "127.0.0.1:8080";

/// Default budget of one request, from its first byte to its answer.
pub const REQUEST_TIMEOUT_MS_DEFAULT: u64 = 25_000;

/// Longest request budget accepted.
pub const REQUEST_TIMEOUT_MS_MAX: u64 = 10 * 60 * 1000;

/// Default cap on API requests in flight; beyond it the API answers 503 overloaded at once.
pub const IN_FLIGHT_MAX_DEFAULT: usize = 1_024;

/// Largest in-flight cap accepted.
pub const IN_FLIGHT_MAX_LIMIT: usize = 100_000;

/// Default time a client has to send a whole request head; also the
/// longest a keep-alive connection may sit idle between requests.
pub const HEADER_READ_TIMEOUT_MS_DEFAULT: u64 = 10_000;

/// Longest header-read timeout accepted.
pub const HEADER_READ_TIMEOUT_MS_MAX: u64 = 10 * 60 * 1000;

/// Default cap on open client connections; at the cap the server stops
/// accepting until one closes. Keep the process's file descriptor limit
/// (`ulimit -n`) above it.
pub const CONNECTIONS_MAX_DEFAULT: usize = 4_096;

/// Largest connection cap accepted.
pub const CONNECTIONS_MAX_LIMIT: usize = 1_000_000;

/// Without `server.connections_per_peer_max`, one peer address may hold
/// this share of `connections_max` (a quarter: 1,024 of the default 4,096),
/// so a single client needs four addresses to fill the cap, while a load
/// test or a busy client on one address still gets a thousand connections
/// (`connections.rs`).
pub const CONNECTIONS_PER_PEER_DIVISOR: usize = 4;

/// Most waiters (`Prefer: wait`) on one key in one instance accepted for
/// `server.prefer_wait_waiters_per_key_max` (default: store-core's
/// `WAITERS_PER_KEY_MAX_DEFAULT`, 128). One commit wakes every waiter on
/// its key at once, and each reads the record again: past ten thousand,
/// one answer becomes a burst of store reads, not a wait.
pub const PREFER_WAIT_WAITERS_PER_KEY_LIMIT: usize = 10_000;

/// Most waiters in one instance accepted for `server.prefer_wait_waiters_max`.
/// Every waiter holds a client connection, so this is
/// [`CONNECTIONS_MAX_LIMIT`]: a higher cap could never be reached. The cap
/// must also stay below `in_flight_max` ([`ServerConfig::validate`]).
pub const PREFER_WAIT_WAITERS_LIMIT: usize = CONNECTIONS_MAX_LIMIT;

/// Without `server.prefer_wait_waiters_max`, the waiters of one instance
/// are capped at `in_flight_max` divided by this: half (512 of the default
/// 1,024). A waiter keeps its place under the in-flight cap while it waits,
/// so waiters up to the in-flight cap would leave no place for work.
pub const PREFER_WAIT_WAITERS_IN_FLIGHT_DIVISOR: usize = 2;

/// Without `server.prefer_wait_waiters_per_caller_max`, one caller's
/// waiters are capped at the instance's waiter cap divided by this: a
/// quarter (128 of the default 512), so one caller that sends every retry
/// with `Prefer: wait` cannot hold every waiter's place, nor with them the
/// in-flight places of everyone else.
pub const PREFER_WAIT_WAITERS_PER_CALLER_DIVISOR: usize = 4;

/// Default time shutdown waits for requests and their work to finish.
pub const SHUTDOWN_GRACE_MS_DEFAULT: u64 = 30_000;

/// Default time between readiness failing and the listener closing at
/// shutdown: long enough for a load balancer to see the probe fail and stop
/// sending (a couple of probe periods). Capped by the grace period.
pub const SHUTDOWN_READINESS_DELAY_MS_DEFAULT: u64 = 2_000;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// `host:port`; port 0 picks a free port (tests).
    pub listen: String,
    pub request_timeout_ms: u64,
    /// The most API requests in flight, counting the work a request leaves
    /// running after its client hung up.
    pub in_flight_max: usize,
    /// The whole shutdown, from the signal: readiness delay, draining
    /// connections, and the idempotent work they left running.
    pub shutdown_grace_ms: u64,
    /// At shutdown, how long `/readyz` answers 503 before the listener
    /// closes (capped by `shutdown_grace_ms`).
    pub shutdown_readiness_delay_ms: u64,
    /// How often the stores' readiness is checked in the background
    /// (`/readyz` answers from the last check and reaches no store), and
    /// the longest one check may take.
    pub readiness_refresh_ms: u64,
    /// `Retry-After` on store outages, overload and timeouts.
    pub retry_after_s: u64,
    /// The longest a request's `Prefer: wait=N` waits for another attempt
    /// on its key before 409 (docs/design.md#waiting); 0 turns waiting off.
    /// The wait applied is also shorter than the request budget
    /// ([`ServerConfig::prefer_wait_applied_max_s`]), so a waiter answers
    /// before its request times out.
    pub prefer_wait_max_s: u64,
    /// The most requests waiting (`Prefer: wait`) on one key in this
    /// instance; past it a request gets its 409 at once
    /// (docs/design.md#wait-limits).
    pub prefer_wait_waiters_per_key_max: usize,
    /// The most requests waiting in this instance, all keys together; past
    /// it a request gets its 409 at once. Below `in_flight_max` (a waiter
    /// keeps its in-flight place); default half of it
    /// ([`ServerConfig::prefer_wait_waiters_max`]).
    pub prefer_wait_waiters_max: Option<usize>,
    /// The most requests of one caller waiting in this instance; past it
    /// that caller's request gets its 409 at once. Default a quarter of
    /// the instance's waiter cap.
    pub prefer_wait_waiters_per_caller_max: Option<usize>,
    /// Time a client has to send a whole request head, and the longest a
    /// keep-alive connection may sit idle; past it the connection is closed.
    pub header_read_timeout_ms: u64,
    /// Time a client has to send a whole request body after its head;
    /// past it, 408 `body_timeout` and nothing claimed (`body_read.rs`).
    pub body_read_timeout_ms: u64,
    /// The most client connections open at once.
    pub connections_max: usize,
    /// The most connections one peer address (an IPv6 /64) holds at once;
    /// one more is closed on accept. Default: a quarter of
    /// `connections_max` ([`ServerConfig::connections_per_peer_max`]).
    /// Behind a load balancer, whose few addresses every client shares,
    /// set it to `connections_max`.
    pub connections_per_peer_max: Option<usize>,
    /// Accept the development caller (whose token is public) on an address
    /// other than loopback. Off: such a config is refused.
    pub allow_demo_caller_on_public_address: bool,
    /// Workers and the CoDel-bounded queue in front of them (`admission.rs`).
    pub admission: AdmissionConfig,
    /// HTTPS on the listener; off (plain HTTP) unless both files are set.
    pub tls: ServerTlsConfig,
}

impl ServerConfig {
    /// The wait a `Prefer: wait` is granted at most: `prefer_wait_max_s`,
    /// and the longest whole number of seconds shorter than the request
    /// budget, so a waiter answers before its request times out (0, no
    /// waiting, when not even a second fits).
    pub fn prefer_wait_applied_max_s(&self) -> u64 {
        self.prefer_wait_max_s
            .min(self.request_timeout_ms.saturating_sub(1) / 1_000)
    }

    /// The instance's waiter cap: as configured, else half the in-flight
    /// cap (at least one).
    pub fn prefer_wait_waiters_max(&self) -> usize {
        self.prefer_wait_waiters_max
            .unwrap_or((self.in_flight_max / PREFER_WAIT_WAITERS_IN_FLIGHT_DIVISOR).max(1))
    }

    /// One caller's waiter cap: as configured, else a quarter of the
    /// instance's (at least one).
    pub fn prefer_wait_waiters_per_caller_max(&self) -> usize {
        self.prefer_wait_waiters_per_caller_max
            .unwrap_or((self.prefer_wait_waiters_max() / PREFER_WAIT_WAITERS_PER_CALLER_DIVISOR).max(1))
    }

    /// The waiter caps for the store's change hub, with store-core's
    /// fallback poll interval. [`ServerConfig::validate`] has checked them;
    /// the per-key default is held to the instance's cap when that is lower.
    pub fn prefer_wait_limits(&self) -> Result<WaitLimits, ConfigError> {
        let waiters_max = self.prefer_wait_waiters_max();
        WaitLimits::new(
            self.prefer_wait_waiters_per_key_max.min(waiters_max),
            waiters_max,
            WAIT_POLL_INTERVAL_MS_DEFAULT,
        )
        .and_then(|limits| limits.with_waiters_per_caller_max(self.prefer_wait_waiters_per_caller_max()))
        .map_err(|error| field_error("server.prefer_wait_waiters_per_caller_max", error.to_string()))
    }

    /// The per-peer connection cap: as configured, else a quarter of the
    /// connection cap (at least one).
    pub fn connections_per_peer_max(&self) -> usize {
        self.connections_per_peer_max
            .unwrap_or((self.connections_max / CONNECTIONS_PER_PEER_DIVISOR).max(1))
    }

    /// The time between two background readiness checks.
    pub fn readiness_refresh(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.readiness_refresh_ms)
    }

    /// Checks every field of `[server]` but its `admission` and `tls`
    /// sections (their owners check those).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let server = self;
        check_range(
            "server.request_timeout_ms",
            server.request_timeout_ms,
            1,
            REQUEST_TIMEOUT_MS_MAX,
        )?;
        check_range(
            "server.in_flight_max",
            server.in_flight_max as u64,
            1,
            IN_FLIGHT_MAX_LIMIT as u64,
        )?;
        check_range(
            "server.shutdown_grace_ms",
            server.shutdown_grace_ms,
            0,
            REQUEST_TIMEOUT_MS_MAX,
        )?;
        check_range(
            "server.shutdown_readiness_delay_ms",
            server.shutdown_readiness_delay_ms,
            0,
            REQUEST_TIMEOUT_MS_MAX,
        )?;
        check_range(
            "server.header_read_timeout_ms",
            server.header_read_timeout_ms,
            1,
            HEADER_READ_TIMEOUT_MS_MAX,
        )?;
        check_range(
            "server.readiness_refresh_ms",
            server.readiness_refresh_ms,
            READINESS_REFRESH_MS_MIN,
            READINESS_REFRESH_MS_MAX,
        )?;
        check_range(
            "server.body_read_timeout_ms",
            server.body_read_timeout_ms,
            1,
            BODY_READ_TIMEOUT_MS_MAX,
        )?;
        check_range(
            "server.connections_max",
            server.connections_max as u64,
            1,
            CONNECTIONS_MAX_LIMIT as u64,
        )?;
        if let Some(per_peer) = server.connections_per_peer_max {
            check_range(
                "server.connections_per_peer_max",
                per_peer as u64,
                1,
                server.connections_max as u64,
            )?;
        }
        check_range("server.retry_after_s", server.retry_after_s, 1, RETRY_AFTER_S_MAX)?;
        check_range(
            "server.prefer_wait_max_s",
            server.prefer_wait_max_s,
            0,
            idem_http::WAIT_CAP_S_MAX,
        )?;
        self.validate_prefer_wait_waiters()
    }

    /// At least one waiter (0 would refuse every wait; `prefer_wait_max_s =
    /// 0` turns waiting off), at most the named limits, fewer in the
    /// instance than requests in flight (each waiter keeps its in-flight
    /// place, and work needs some), and no more per key or per caller than
    /// in the whole instance.
    fn validate_prefer_wait_waiters(&self) -> Result<(), ConfigError> {
        let server = self;
        if let Some(waiters_max) = server.prefer_wait_waiters_max {
            let below_in_flight = server.in_flight_max.saturating_sub(1).max(1);
            check_range(
                "server.prefer_wait_waiters_max",
                waiters_max as u64,
                1,
                PREFER_WAIT_WAITERS_LIMIT.min(below_in_flight) as u64,
            )?;
        }
        let waiters_max = server.prefer_wait_waiters_max();
        if let Some(per_caller) = server.prefer_wait_waiters_per_caller_max {
            check_range(
                "server.prefer_wait_waiters_per_caller_max",
                per_caller as u64,
                1,
                waiters_max as u64,
            )?;
        }
        // An explicit instance cap bounds the per-key one; the derived one
        // holds it to itself instead ([`ServerConfig::prefer_wait_limits`]).
        let per_key_ceiling = match server.prefer_wait_waiters_max {
            Some(waiters_max) => PREFER_WAIT_WAITERS_PER_KEY_LIMIT.min(waiters_max),
            None => PREFER_WAIT_WAITERS_PER_KEY_LIMIT,
        };
        check_range(
            "server.prefer_wait_waiters_per_key_max",
            server.prefer_wait_waiters_per_key_max as u64,
            1,
            per_key_ceiling as u64,
        )
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: LISTEN_DEFAULT.to_owned(),
            request_timeout_ms: REQUEST_TIMEOUT_MS_DEFAULT,
            in_flight_max: IN_FLIGHT_MAX_DEFAULT,
            shutdown_grace_ms: SHUTDOWN_GRACE_MS_DEFAULT,
            shutdown_readiness_delay_ms: SHUTDOWN_READINESS_DELAY_MS_DEFAULT,
            readiness_refresh_ms: READINESS_REFRESH_MS_DEFAULT,
            retry_after_s: RETRY_AFTER_S_DEFAULT,
            prefer_wait_max_s: idem_http::WAIT_CAP_S_DEFAULT,
            prefer_wait_waiters_per_key_max: WAITERS_PER_KEY_MAX_DEFAULT,
            prefer_wait_waiters_max: None,
            prefer_wait_waiters_per_caller_max: None,
            header_read_timeout_ms: HEADER_READ_TIMEOUT_MS_DEFAULT,
            body_read_timeout_ms: BODY_READ_TIMEOUT_MS_DEFAULT,
            connections_max: CONNECTIONS_MAX_DEFAULT,
            connections_per_peer_max: None,
            allow_demo_caller_on_public_address: false,
            admission: AdmissionConfig::default(),
            tls: ServerTlsConfig::default(),
        }
    }
}
