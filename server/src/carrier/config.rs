//! `[carrier]` and `[carrier.simulator]`: where the carrier is, its call
//! budget and retries, and the simulator's latencies and faults, with
//! their defaults, limits and validation.

use crate::carrier::retry::{
    CARRIER_RETRIES_LIMIT, CARRIER_RETRIES_MAX_DEFAULT, CARRIER_RETRY_BACKOFF_MS_DEFAULT, CARRIER_RETRY_BACKOFF_MS_MAX,
    CarrierRetries,
};
use crate::setting::{ConfigError, RETRY_AFTER_S_DEFAULT, RETRY_AFTER_S_MAX, check_range, field_error};
use serde::Deserialize;
use std::net::SocketAddr;
use store_core::Policy;
use store_core::redact::redact_secrets;

/// Default carrier call timeout (20 s inside the 30 s lease: docs/design.md#carrier-timeout).
pub const CARRIER_TIMEOUT_MS_DEFAULT: u64 = 20_000;

/// Longest carrier timeout accepted.
pub const CARRIER_TIMEOUT_MS_MAX: u64 = 10 * 60 * 1000;

/// Least time the lease must hold past the carrier budget: the commit of
/// the label and its record after the carrier's answer.
pub const LEASE_MARGIN_MS_MIN: u64 = 250;

/// The margin grows with the carrier budget, a quarter of it: a deployment
/// that gives the carrier seconds has stores and machines whose commits can
/// take a good part of a second when loaded (default: 20 s of carrier
/// budget, 5 s of margin, inside the 30 s lease).
pub const LEASE_MARGIN_TIMEOUT_DIVISOR: u64 = 4;

/// Time the lease must hold past a carrier budget of `timeout_ms`.
pub fn lease_margin_ms(timeout_ms: u64) -> u64 {
    LEASE_MARGIN_MS_MIN.max(timeout_ms / LEASE_MARGIN_TIMEOUT_DIVISOR)
}

/// Longest simulated carrier latency accepted.
pub const SIMULATOR_LATENCY_MS_MAX: u64 = 10 * 60 * 1000;

/// `Debug` by hand: the URL may carry a password ([`redact_secrets`]).
#[derive(Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CarrierConfig {
    /// Base URL of the carrier (`http://127.0.0.1:9090`, `https://...`).
    /// Empty: start the simulator in-process, which only a loopback
    /// listener may serve ([`CarrierConfig::check_listener_address`]).
    pub url: String,
    /// For an `https://` carrier: trust only this PEM CA. Empty: the
    /// operating system's trust store.
    pub ca_file: String,
    /// Budget of one carrier call; must be shorter than the lease.
    pub timeout_ms: u64,
    /// `Retry-After` when the carrier gave no definite answer.
    pub retry_after_s: u64,
    /// Retries of a call that failed in a way a repeat may cure (a dropped
    /// connection, a 5xx), within `timeout_ms`; 0 turns them off.
    pub retries_max: u32,
    /// Upper bound of the first retry's random pause; doubled per retry.
    pub retry_backoff_ms: u64,
    pub simulator: SimulatorConfig,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimulatorConfig {
    /// Each call waits a uniform time in [latency_ms_min, latency_ms_max].
    pub latency_ms_min: u64,
    pub latency_ms_max: u64,
    /// A fraction of calls wait `slow_ms` instead: the distribution's tail.
    pub slow_rate: f64,
    pub slow_ms: u64,
    /// Fraction of calls answered 503 before any purchase.
    pub error_rate: f64,
    /// Fraction of purchases whose reply is dropped (connection closed).
    pub lost_reply_rate: f64,
    /// Seed of the simulator's random choices; 0 picks one at random.
    pub seed: u64,
}

impl std::fmt::Debug for CarrierConfig {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("CarrierConfig")
            .field("url", &redact_secrets(&self.url))
            .field("ca_file", &self.ca_file)
            .field("timeout_ms", &self.timeout_ms)
            .field("retry_after_s", &self.retry_after_s)
            .field("retries_max", &self.retries_max)
            .field("retry_backoff_ms", &self.retry_backoff_ms)
            .field("simulator", &self.simulator)
            .finish()
    }
}

impl CarrierConfig {
    /// The in-process simulator sells fake labels, and a saved answer is
    /// its parcel's label for the whole retention (a carrier URL set later
    /// still replays the fake one; in a fleet each instance sells its own).
    /// So an empty `carrier.url` is for development: served only on a
    /// loopback address, like the demo caller, and refused on any other,
    /// naming the safe alternative.
    pub fn check_listener_address(&self, address: SocketAddr) -> Result<(), ConfigError> {
        if !self.url.is_empty() || address.ip().is_loopback() {
            return Ok(());
        }
        Err(field_error(
            "carrier.url",
            format!(
                "is empty, which sells fake labels from the in-process carrier simulator, and {address} is \
                 not a loopback address: its clients would keep those labels as their parcels' labels. Set \
                 carrier.url to the carrier's base URL (for a shared test carrier, run `server carrier \
                 --listen HOST:PORT` and set carrier.url = \"http://HOST:PORT\"); the in-process simulator \
                 serves a loopback listener only"
            ),
        ))
    }

    /// docs/design.md#lease-outlasts-call: an attempt must get its carrier
    /// answer (or give up) and commit it while it still holds the lease,
    /// or a retry takes the key over and two attempts run at once. The
    /// carrier budget, `timeout_ms`, counts from the claim (the wait for
    /// readmission after `Prefer: wait` and the parcel lookup are inside
    /// it) and covers the client's retries (each ends by the same
    /// deadline); the lease must also leave [`lease_margin_ms`] after it
    /// for the commit.
    pub fn check_lease_outlasts_call(&self, policy: &Policy) -> Result<(), ConfigError> {
        let needed_ms = self.timeout_ms.saturating_add(lease_margin_ms(self.timeout_ms));
        if policy.lease_ms() >= needed_ms {
            return Ok(());
        }
        Err(field_error(
            "policy.lease_ms",
            format!(
                "the lease ({} ms) must outlast carrier.timeout_ms ({} ms), which counts from the claim \
                 and includes the carrier client's retries, by at least {} ms for the commit after it: \
                 raise policy.lease_ms to {needed_ms} or more, or lower carrier.timeout_ms",
                policy.lease_ms(),
                self.timeout_ms,
                lease_margin_ms(self.timeout_ms),
            ),
        ))
    }

    /// How the carrier client retries a call within its request.
    pub fn retries(&self) -> CarrierRetries {
        CarrierRetries {
            retries_max: self.retries_max,
            backoff_base: std::time::Duration::from_millis(self.retry_backoff_ms),
        }
    }

    /// Checks `[carrier]` and its simulator; the lease of `policy` must
    /// outlast a call.
    pub fn validate(&self, policy: &Policy) -> Result<(), ConfigError> {
        let carrier = self;
        check_range("carrier.timeout_ms", carrier.timeout_ms, 1, CARRIER_TIMEOUT_MS_MAX)?;
        check_range("carrier.retry_after_s", carrier.retry_after_s, 1, RETRY_AFTER_S_MAX)?;
        check_range(
            "carrier.retries_max",
            u64::from(carrier.retries_max),
            0,
            u64::from(CARRIER_RETRIES_LIMIT),
        )?;
        check_range(
            "carrier.retry_backoff_ms",
            carrier.retry_backoff_ms,
            1,
            CARRIER_RETRY_BACKOFF_MS_MAX,
        )?;
        self.check_lease_outlasts_call(policy)?;
        if !carrier.url.is_empty() && !carrier.url.starts_with("http://") && !carrier.url.starts_with("https://") {
            return Err(field_error(
                "carrier.url",
                "must start with http:// or https:// (or be empty for the simulator)",
            ));
        }
        if !carrier.ca_file.is_empty() && !carrier.url.starts_with("https://") {
            return Err(field_error(
                "carrier.ca_file",
                "is set but carrier.url is not https://: the CA would never be used",
            ));
        }
        self.simulator.validate()
    }
}

impl SimulatorConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let simulator = self;
        for (field, rate) in [
            ("carrier.simulator.slow_rate", simulator.slow_rate),
            ("carrier.simulator.error_rate", simulator.error_rate),
            ("carrier.simulator.lost_reply_rate", simulator.lost_reply_rate),
        ] {
            if !(0.0..=1.0).contains(&rate) {
                return Err(field_error(field, format!("{rate} is not a fraction between 0 and 1")));
            }
        }
        check_range(
            "carrier.simulator.latency_ms_max",
            simulator.latency_ms_max,
            0,
            SIMULATOR_LATENCY_MS_MAX,
        )?;
        check_range(
            "carrier.simulator.slow_ms",
            simulator.slow_ms,
            0,
            SIMULATOR_LATENCY_MS_MAX,
        )?;
        if simulator.latency_ms_min > simulator.latency_ms_max {
            return Err(field_error(
                "carrier.simulator.latency_ms_min",
                "must not exceed carrier.simulator.latency_ms_max",
            ));
        }
        Ok(())
    }
}

impl Default for CarrierConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            ca_file: String::new(),
            timeout_ms: CARRIER_TIMEOUT_MS_DEFAULT,
            retry_after_s: RETRY_AFTER_S_DEFAULT,
            retries_max: CARRIER_RETRIES_MAX_DEFAULT,
            retry_backoff_ms: CARRIER_RETRY_BACKOFF_MS_DEFAULT,
            simulator: SimulatorConfig::default(),
        }
    }
}

impl Default for SimulatorConfig {
    fn default() -> Self {
        Self {
            latency_ms_min: 20,
            latency_ms_max: 80,
            slow_rate: 0.0,
            slow_ms: 0,
            error_rate: 0.0,
            lost_reply_rate: 0.0,
            seed: 0,
        }
    }
}
