//! Reading the `Idempotency-Key` header.
//!
//! The IETF draft makes the value an RFC 8941 sf-string (`"abc"`), while
//! most clients send it bare (`abc`); both are accepted. A quoted value may
//! escape `"` and `\` with a backslash; any other escape is refused, as
//! RFC 8941 refuses it. The key itself (after unquoting) must be 1 to 255
//! printable ASCII characters, which `IdempotencyKey` checks.

use axum::http::HeaderMap;
use store_core::IdempotencyKey;
use store_core::types::IDEMPOTENCY_KEY_BYTES_MAX;

/// The header's name, lowercase as HTTP/2 spells it.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";

/// Everything [`parse_key`] accepts, as an ECMA-262 regular expression for
/// the OpenAPI document: a bare key (printable ASCII, not starting with `"`,
/// without spaces at either end, 1 to 255 characters) or an RFC 8941
/// sf-string whose content, once `\"` and `\\` are unescaped, is 1 to
/// 255 printable ASCII characters. HTTP strips spaces around a field value
/// (RFC 9110 section 5.5), so no value the server reads has them.
pub const KEY_HEADER_PATTERN: &str = r#"^(?:[!#-~](?:[ -~]{0,253}[!-~])?|"(?:[ !#-\[\]-~]|\\["\\]){1,255}")$"#;
/// Longest header value [`parse_key`] accepts: 255 escaped characters
/// between quotes.
pub const KEY_HEADER_BYTES_MAX: usize = 2 + 2 * IDEMPOTENCY_KEY_BYTES_MAX;

/// Why no key could be read from a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyHeaderError {
    /// The request has no `Idempotency-Key` header.
    #[error("the Idempotency-Key header is missing")]
    Missing,
    /// The header is there but names no valid key; the string says why.
    #[error("{0}")]
    Invalid(String),
}

impl From<KeyHeaderError> for crate::IdempotencyError {
    fn from(error: KeyHeaderError) -> Self {
        match error {
            KeyHeaderError::Missing => crate::IdempotencyError::KeyMissing,
            KeyHeaderError::Invalid(reason) => crate::IdempotencyError::KeyInvalid { reason },
        }
    }
}

/// Reads the one `Idempotency-Key` header of a request.
pub fn idempotency_key(headers: &HeaderMap) -> Result<IdempotencyKey, KeyHeaderError> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY_HEADER).iter();
    let Some(value) = values.next() else {
        return Err(KeyHeaderError::Missing);
    };
    if values.next().is_some() {
        return Err(KeyHeaderError::Invalid("the header appears more than once".into()));
    }
    parse_key(value.as_bytes())
}

/// Parses one header value: an sf-string or a bare key.
pub fn parse_key(raw: &[u8]) -> Result<IdempotencyKey, KeyHeaderError> {
    let trimmed = raw.trim_ascii();
    let key = match trimmed.first() {
        Some(b'"') => unquote_sf_string(trimmed)?,
        _ => trimmed.to_vec(),
    };
    IdempotencyKey::from_bytes(&key).map_err(|error| KeyHeaderError::Invalid(error.to_string()))
}

/// RFC 8941 §4.2.5: `"` then printable ASCII with `\"` and `\\` escapes,
/// then `"`, with nothing after it (parameters are not accepted).
fn unquote_sf_string(quoted: &[u8]) -> Result<Vec<u8>, KeyHeaderError> {
    let invalid = |reason: &str| KeyHeaderError::Invalid(format!("quoted key: {reason}"));
    let mut key = Vec::with_capacity(quoted.len());
    let mut bytes = quoted.iter().copied().skip(1);
    loop {
        match bytes.next() {
            None => return Err(invalid("no closing quote")),
            Some(b'"') => break,
            Some(b'\\') => match bytes.next() {
                Some(escaped @ (b'"' | b'\\')) => key.push(escaped),
                _ => return Err(invalid("only \\\" and \\\\ may be escaped")),
            },
            Some(byte) if (0x20..=0x7e).contains(&byte) => key.push(byte),
            Some(_) => return Err(invalid("only printable ASCII is allowed")),
        }
    }
    if bytes.next().is_some() {
        return Err(invalid("nothing may follow the closing quote"));
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn key(raw: &str) -> Result<String, KeyHeaderError> {
        parse_key(raw.as_bytes()).map(|key| key.as_str().to_owned())
    }

    #[test]
    fn bare_and_quoted_forms_name_the_same_key() {
        assert_eq!(key("label:918273:1:v1").unwrap(), "label:918273:1:v1");
        assert_eq!(key("\"label:918273:1:v1\"").unwrap(), "label:918273:1:v1");
        assert_eq!(key(r#""a\"b\\c""#).unwrap(), r#"a"b\c"#);
        assert_eq!(key("  spaced  ").unwrap(), "spaced");
    }

    #[test]
    fn malformed_quoted_keys_are_invalid() {
        for bad in [r#""abc"#, r#""a\nb""#, r#""abc";p=1"#, r#""""#, "\"a\u{7f}\""] {
            assert!(matches!(key(bad), Err(KeyHeaderError::Invalid(_))), "{bad:?}");
        }
    }

    #[test]
    fn length_and_alphabet_limits_apply_after_unquoting() {
        assert!(key(&"k".repeat(255)).is_ok());
        assert!(key(&format!("\"{}\"", "k".repeat(255))).is_ok());
        assert!(matches!(key(&"k".repeat(256)), Err(KeyHeaderError::Invalid(_))));
        assert!(matches!(key(""), Err(KeyHeaderError::Invalid(_))));
        assert!(matches!(parse_key(&[0x61, 0xff]), Err(KeyHeaderError::Invalid(_))));
    }

    #[test]
    fn the_documented_pattern_and_limits_say_what_the_parser_accepts() {
        assert!(KEY_HEADER_PATTERN.starts_with('^') && KEY_HEADER_PATTERN.ends_with('$'));
        let unanchored = &KEY_HEADER_PATTERN[1..KEY_HEADER_PATTERN.len() - 1];
        let values = proptest::string::string_regex(unanchored).expect("the pattern is a regex");
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        runner
            .run(&values, |value| {
                proptest::prop_assert!(value.len() <= KEY_HEADER_BYTES_MAX, "{value:?}");
                proptest::prop_assert!(parse_key(value.as_bytes()).is_ok(), "{value:?}");
                Ok(())
            })
            .unwrap();
        let longest_quoted = format!("\"{}\"", "\\\\".repeat(IDEMPOTENCY_KEY_BYTES_MAX));
        assert_eq!(longest_quoted.len(), KEY_HEADER_BYTES_MAX);
        assert!(parse_key(longest_quoted.as_bytes()).is_ok());
    }

    #[test]
    fn missing_and_repeated_headers_are_told_apart() {
        let mut headers = HeaderMap::new();
        assert_eq!(idempotency_key(&headers), Err(KeyHeaderError::Missing));
        headers.append(IDEMPOTENCY_KEY_HEADER, HeaderValue::from_static("a"));
        assert!(idempotency_key(&headers).is_ok());
        headers.append(IDEMPOTENCY_KEY_HEADER, HeaderValue::from_static("b"));
        assert!(matches!(idempotency_key(&headers), Err(KeyHeaderError::Invalid(_))));
    }
}
