//! The `Prefer: wait=N` request preference (RFC 7240 section 4.3): a
//! request that finds its key started by another attempt may wait up to N
//! seconds for that attempt to end instead of getting 409 at once
//! (docs/design.md#waiting).
//!
//! Parsing is lenient, as RFC 7240 asks of servers: preferences are
//! comma-separated, may carry `;` parameters, names compare without case,
//! unknown preferences are ignored, a malformed `wait` is ignored (the
//! request is answered as if it had not asked), and only the first `wait`
//! counts (RFC 7240 section 2).

use axum::http::HeaderMap;

/// The request header carrying preferences.
pub const PREFER_HEADER: &str = "prefer";
/// The response header naming the preferences that were honoured.
pub const PREFERENCE_APPLIED_HEADER: &str = "preference-applied";
/// Most bytes of `Prefer` values read per request; a longer header is
/// ignored whole, so a client cannot make the layer scan without bound.
pub const PREFER_HEADER_BYTES_MAX: usize = 1_024;

/// The seconds a request's `Prefer` header asks to wait, if it asks.
/// A number too large for `u64` asks for the longest wait (the cap then
/// bounds it).
pub fn prefer_wait_seconds(headers: &HeaderMap) -> Option<u64> {
    let mut bytes_read = 0;
    for value in headers.get_all(PREFER_HEADER) {
        bytes_read += value.len();
        if bytes_read > PREFER_HEADER_BYTES_MAX {
            return None;
        }
        let Ok(text) = value.to_str() else { continue };
        for preference in text.split(',') {
            let token = preference.split(';').next().unwrap_or_default();
            let Some((name, wait)) = token.split_once('=') else {
                continue;
            };
            if name.trim().eq_ignore_ascii_case("wait") {
                // The first `wait` counts, even when it is malformed.
                return delta_seconds(wait.trim());
            }
        }
    }
    None
}

/// RFC 9110 delay-seconds: one or more digits, optionally quoted.
fn delta_seconds(text: &str) -> Option<u64> {
    let unquoted = text
        .strip_prefix('"')
        .and_then(|rest| rest.strip_suffix('"'))
        .unwrap_or(text);
    if unquoted.is_empty() || !unquoted.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    Some(unquoted.parse::<u64>().unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn wait_of(values: &[&str]) -> Option<u64> {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(PREFER_HEADER, HeaderValue::from_str(value).unwrap());
        }
        prefer_wait_seconds(&headers)
    }

    #[test]
    fn reads_wait_among_other_preferences_without_case() {
        assert_eq!(wait_of(&["wait=5"]), Some(5));
        assert_eq!(wait_of(&["respond-async, WAIT=7"]), Some(7));
        assert_eq!(wait_of(&["return=minimal; foo=bar", " Wait = \"3\" ; x=y"]), Some(3));
        assert_eq!(wait_of(&["wait=99999999999999999999999"]), Some(u64::MAX));
    }

    #[test]
    fn ignores_absent_malformed_and_repeated_waits() {
        assert_eq!(wait_of(&[]), None);
        assert_eq!(wait_of(&["respond-async"]), None);
        assert_eq!(wait_of(&["wait=soon"]), None);
        assert_eq!(wait_of(&["wait=-1"]), None);
        assert_eq!(wait_of(&["wait="]), None);
        assert_eq!(wait_of(&["wait=2", "wait=9"]), Some(2));
        assert_eq!(wait_of(&["wait=x, wait=9"]), None, "only the first wait counts");
    }

    #[test]
    fn ignores_a_header_past_its_byte_limit() {
        let long = format!("{}, wait=4", "a".repeat(PREFER_HEADER_BYTES_MAX));
        assert_eq!(wait_of(&[&long]), None);
    }
}
