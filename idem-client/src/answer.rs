//! What one attempt's answer means to the client (docs/design.md#status-codes):
//!
//! | answer | what the client does |
//! |---|---|
//! | 201 (any 2xx) first run | done |
//! | 201 with `Idempotent-Replayed: true` | done, reported as a replay |
//! | 409 in progress | retry with the same key |
//! | 422 key reused | never retried: fix the body or start a new intent |
//! | 400 bad key or request | never retried |
//! | 503, other 5xx, timeout, connection error | retried with the same key |
//! | other 4xx (and 1xx, 3xx) | not retried |
//!
//! and `Retry-After`, in delay-seconds or as an HTTP date (RFC 9110
//! section 10.2.3).

use reqwest::header::HeaderMap;
use std::time::{Duration, SystemTime};

/// The replay header (Stripe's convention, which the Label service follows).
pub const REPLAYED_HEADER: &str = "idempotent-replayed";
/// The request header of RFC 7240 preferences.
pub const PREFER_HEADER: &str = "prefer";
/// The answer's header naming the preferences the server honoured.
pub const PREFERENCE_APPLIED_HEADER: &str = "preference-applied";
/// The request header telling the server how long this attempt will still
/// wait, in milliseconds (the Label service starts no work past it).
pub const REQUEST_TIMEOUT_MS_HEADER: &str = "request-timeout-ms";
/// The answer's finer retry hint, in milliseconds (Azure's
/// `retry-after-ms`): read before `Retry-After`, which the server always
/// sends beside it.
pub const RETRY_AFTER_MS_HEADER: &str = "retry-after-ms";

/// One attempt's answer, classified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AnswerClass {
    /// A 2xx: the intent is done. `replayed` when the server answered from
    /// the key's saved response.
    Done {
        /// `Idempotent-Replayed: true` was present.
        replayed: bool,
    },
    /// 409: another attempt holds the key. Retried with the same key.
    InProgress,
    /// 422: the key was used with another body. Never retried.
    KeyReused,
    /// 400: a bad key or request. Never retried.
    BadRequest,
    /// Any 5xx (503 included): the service did nothing final. Retried.
    Unavailable {
        /// The status.
        status: u16,
    },
    /// No answer within the attempt's deadline: it may or may not have run.
    /// Retried with the same key.
    Timeout,
    /// The connection failed before or while the attempt was sent or
    /// answered. Retried with the same key.
    Connection,
    /// Any other status: not retried.
    Refused {
        /// The status.
        status: u16,
    },
}

impl AnswerClass {
    /// The class of an answer with `status` whose `Idempotent-Replayed`
    /// header said `replayed`.
    pub fn of_status(status: u16, replayed: bool) -> Self {
        match status {
            200..=299 => AnswerClass::Done { replayed },
            409 => AnswerClass::InProgress,
            422 => AnswerClass::KeyReused,
            400 => AnswerClass::BadRequest,
            500..=599 => AnswerClass::Unavailable { status },
            _ => AnswerClass::Refused { status },
        }
    }

    /// The class of an answer's status and headers.
    pub fn of_answer(status: u16, headers: &HeaderMap) -> Self {
        Self::of_status(status, is_replayed(headers))
    }

    /// Whether the client asks again, with the same key, after this answer.
    pub fn is_retried(&self) -> bool {
        matches!(
            self,
            AnswerClass::InProgress | AnswerClass::Unavailable { .. } | AnswerClass::Timeout | AnswerClass::Connection
        )
    }

    /// A short, fixed name, for metric labels and spans.
    pub fn name(&self) -> &'static str {
        match self {
            AnswerClass::Done { replayed: false } => "created",
            AnswerClass::Done { replayed: true } => "replayed",
            AnswerClass::InProgress => "in_progress",
            AnswerClass::KeyReused => "key_reused",
            AnswerClass::BadRequest => "bad_request",
            AnswerClass::Unavailable { .. } => "unavailable",
            AnswerClass::Timeout => "timeout",
            AnswerClass::Connection => "connection",
            AnswerClass::Refused { .. } => "refused",
        }
    }
}

/// `Idempotent-Replayed: true` (any case) is present.
pub fn is_replayed(headers: &HeaderMap) -> bool {
    headers
        .get(REPLAYED_HEADER)
        .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"true"))
}

/// `Preference-Applied` is present: the server honoured `Prefer: wait`.
pub fn wait_was_applied(headers: &HeaderMap) -> bool {
    headers.contains_key(PREFERENCE_APPLIED_HEADER)
}

/// A `Retry-After` value, as the server sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryAfter {
    /// `Retry-After-Ms`: milliseconds.
    Milliseconds(u64),
    /// Delay-seconds.
    Seconds(u64),
    /// An HTTP date.
    Date(SystemTime),
}

impl RetryAfter {
    /// Reads `Retry-After-Ms` (whole milliseconds) from an answer's
    /// headers, else `Retry-After`; `None` when both are absent or
    /// malformed.
    pub fn from_headers(headers: &HeaderMap) -> Option<Self> {
        let milliseconds = headers
            .get(RETRY_AFTER_MS_HEADER)
            .and_then(|value| value.to_str().ok())
            .and_then(|text| text.trim().parse::<u64>().ok());
        if let Some(milliseconds) = milliseconds {
            return Some(RetryAfter::Milliseconds(milliseconds));
        }
        let text = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?.trim();
        Self::parse(text)
    }

    /// Parses delay-seconds or an HTTP date.
    pub fn parse(text: &str) -> Option<Self> {
        if let Ok(seconds) = text.parse::<u64>() {
            return Some(RetryAfter::Seconds(seconds));
        }
        httpdate::parse_http_date(text).ok().map(RetryAfter::Date)
    }

    /// How long to wait from `wall_now`, at most `cap`: a date in the past
    /// asks for no wait.
    pub fn delay(&self, wall_now: SystemTime, cap: Duration) -> Duration {
        let delay = match self {
            RetryAfter::Milliseconds(milliseconds) => Duration::from_millis(*milliseconds),
            RetryAfter::Seconds(seconds) => Duration::from_secs(*seconds),
            RetryAfter::Date(date) => date.duration_since(wall_now).unwrap_or_default(),
        };
        delay.min(cap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_of_the_table_is_classified_as_it_says() {
        let rows = [
            (201, false, AnswerClass::Done { replayed: false }, false),
            (201, true, AnswerClass::Done { replayed: true }, false),
            (409, false, AnswerClass::InProgress, true),
            (422, false, AnswerClass::KeyReused, false),
            (400, false, AnswerClass::BadRequest, false),
            (503, false, AnswerClass::Unavailable { status: 503 }, true),
            (500, false, AnswerClass::Unavailable { status: 500 }, true),
            (502, false, AnswerClass::Unavailable { status: 502 }, true),
            (401, false, AnswerClass::Refused { status: 401 }, false),
            (404, false, AnswerClass::Refused { status: 404 }, false),
            (413, false, AnswerClass::Refused { status: 413 }, false),
            (429, false, AnswerClass::Refused { status: 429 }, false),
            (302, false, AnswerClass::Refused { status: 302 }, false),
        ];
        for (status, replayed, class, retried) in rows {
            assert_eq!(AnswerClass::of_status(status, replayed), class, "{status}");
            assert_eq!(class.is_retried(), retried, "{status}");
        }
        assert!(AnswerClass::Timeout.is_retried());
        assert!(AnswerClass::Connection.is_retried());
    }

    #[test]
    fn the_replay_header_is_read_in_any_case() {
        let mut headers = HeaderMap::new();
        assert_eq!(
            AnswerClass::of_answer(201, &headers),
            AnswerClass::Done { replayed: false }
        );
        headers.insert(REPLAYED_HEADER, "True".parse().unwrap());
        assert_eq!(
            AnswerClass::of_answer(201, &headers),
            AnswerClass::Done { replayed: true }
        );
        headers.insert(REPLAYED_HEADER, "false".parse().unwrap());
        assert!(!is_replayed(&headers));
    }

    #[test]
    fn retry_after_is_read_in_seconds_and_as_an_http_date_and_capped() {
        let cap = Duration::from_secs(30);
        let now = httpdate::parse_http_date("Wed, 21 Oct 2015 07:28:00 GMT").unwrap();
        let mut headers = HeaderMap::new();
        assert_eq!(RetryAfter::from_headers(&headers), None);
        headers.insert(reqwest::header::RETRY_AFTER, "2".parse().unwrap());
        let seconds = RetryAfter::from_headers(&headers).unwrap();
        assert_eq!(seconds.delay(now, cap), Duration::from_secs(2));
        assert_eq!(RetryAfter::Seconds(86_400).delay(now, cap), cap);
        headers.insert(
            reqwest::header::RETRY_AFTER,
            "Wed, 21 Oct 2015 07:28:07 GMT".parse().unwrap(),
        );
        let date = RetryAfter::from_headers(&headers).unwrap();
        assert_eq!(date.delay(now, cap), Duration::from_secs(7));
        assert_eq!(date.delay(now + Duration::from_secs(60), cap), Duration::ZERO, "past");
        assert_eq!(RetryAfter::parse("soon"), None);
        // The finer hint wins, and is capped like the others; a malformed
        // one leaves Retry-After.
        headers.insert(RETRY_AFTER_MS_HEADER, "100".parse().unwrap());
        let milliseconds = RetryAfter::from_headers(&headers).unwrap();
        assert_eq!(milliseconds.delay(now, cap), Duration::from_millis(100));
        assert_eq!(RetryAfter::Milliseconds(999_999_999).delay(now, cap), cap);
        headers.insert(RETRY_AFTER_MS_HEADER, "soon".parse().unwrap());
        assert_eq!(RetryAfter::from_headers(&headers), Some(date));
        assert_eq!(RetryAfter::parse("-1"), None);
    }
}
