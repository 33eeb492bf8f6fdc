//! RFC 3339 timestamps (humantime formats them; this crate only says which).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch by the system's clock: a label's
/// `created_at`, which says when the label was bought in real time. It is
/// not the injected `store_core::Clock` the stores and the idempotency
/// layer read (`App::build_with_clock`): nothing decides a lease or a
/// retention by it, so a test moving that clock need not move this one.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis() as u64)
        .unwrap_or(0)
}

/// `2026-09-30T12:34:56.789Z` for milliseconds since the Unix epoch (UTC).
pub fn rfc3339_from_ms(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants_format_as_rfc3339() {
        assert_eq!(rfc3339_from_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_from_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339_from_ms(1_790_000_000_123), "2026-09-21T14:13:20.123Z");
        assert_eq!(rfc3339_from_ms(4_102_444_799_999), "2099-12-31T23:59:59.999Z");
    }
}
