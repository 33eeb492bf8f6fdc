//! The intent key: one key per intent, derived from what names the intent
//! (docs/design.md#key-per-intent), and checked against the server's rules
//! when it is built, so a key the server would refuse never reaches the wire.
//!
//! The server reads `Idempotency-Key` as a bare value or an RFC 8941
//! sf-string and requires the key itself to be 1 to [`KEY_BYTES_MAX`] bytes
//! of printable ASCII (idem-http's `key_header`). A key that a bare header
//! would change (spaces at either end, which HTTP strips, or a leading `"`,
//! which starts an sf-string) is sent quoted, so the server reads exactly
//! the key that was built.

use reqwest::header::HeaderValue;

/// Longest key the server accepts, in bytes (after unquoting).
pub const KEY_BYTES_MAX: usize = 255;
/// Most parts a key is derived from.
pub const KEY_PARTS_MAX: usize = 16;
/// What joins the parts of a derived key (`label:918273:1:v1`).
pub const KEY_PART_SEPARATOR: char = ':';

/// Why a key was refused; nothing was sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The key is empty, or a part of a derived key is.
    #[error("an idempotency key and each of its parts must be at least one byte")]
    Empty,
    /// The key is longer than the server accepts.
    #[error("the idempotency key is {length} bytes, more than {KEY_BYTES_MAX}")]
    TooLong {
        /// The key's length, in bytes.
        length: usize,
    },
    /// A byte outside printable ASCII (0x20 to 0x7E).
    #[error("the idempotency key has byte 0x{byte:02x} at {position}; only printable ASCII 0x20-0x7E is allowed")]
    Byte {
        /// The refused byte.
        byte: u8,
        /// Its position in the key.
        position: usize,
    },
    /// A part contains the separator, so two different intents could
    /// derive the same key (`a:b` + `c` and `a` + `b:c`).
    #[error("part {index} of the key contains '{KEY_PART_SEPARATOR}', which separates the parts")]
    SeparatorInPart {
        /// The part's position, from 0.
        index: usize,
    },
    /// More parts than [`KEY_PARTS_MAX`], or none.
    #[error("a key is derived from 1 to {KEY_PARTS_MAX} parts")]
    PartCount,
    /// An `Idempotency-Key` header value that is not a valid sf-string.
    #[error("the Idempotency-Key header is not a valid sf-string: {0}")]
    Header(&'static str),
}

/// A valid idempotency key and the header value that carries it.
///
/// Cloning is cheap: the header value shares its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntentKey {
    key: String,
    header: HeaderValue,
}

impl IntentKey {
    /// A key derived from the parts that name the intent, joined by
    /// [`KEY_PART_SEPARATOR`]: `["label", "918273", "1", "v1"]` is
    /// `label:918273:1:v1`. The same parts always give the same key, so a
    /// process that restarts mid-retry sends the same key again.
    pub fn from_parts<P: AsRef<str>>(parts: &[P]) -> Result<Self, KeyError> {
        if parts.is_empty() || parts.len() > KEY_PARTS_MAX {
            return Err(KeyError::PartCount);
        }
        let mut key = String::with_capacity(parts.iter().map(|part| part.as_ref().len() + 1).sum());
        for (index, part) in parts.iter().enumerate() {
            let part = part.as_ref();
            if part.is_empty() {
                return Err(KeyError::Empty);
            }
            if part.contains(KEY_PART_SEPARATOR) {
                return Err(KeyError::SeparatorInPart { index });
            }
            if index > 0 {
                key.push(KEY_PART_SEPARATOR);
            }
            key.push_str(part);
        }
        Self::new(key)
    }

    /// A key as it is, for one saved before the first attempt.
    pub fn new(key: impl Into<String>) -> Result<Self, KeyError> {
        let key = key.into();
        check_key(key.as_bytes())?;
        let header = header_value(&key);
        debug_assert_eq!(
            Self::read_header(&header).as_deref(),
            Ok(key.as_str()),
            "the header reads back as the key"
        );
        Ok(Self { key, header })
    }

    /// The key the server reads from an `Idempotency-Key` header value (a
    /// bare key or an sf-string), by the server's rules.
    pub fn from_header(value: &HeaderValue) -> Result<Self, KeyError> {
        Self::new(Self::read_header(value)?)
    }

    fn read_header(value: &HeaderValue) -> Result<String, KeyError> {
        let trimmed = value.as_bytes().trim_ascii();
        let key = match trimmed.first() {
            Some(b'"') => unquote_sf_string(trimmed)?,
            _ => trimmed.to_vec(),
        };
        check_key(&key)?;
        // Printable ASCII is valid UTF-8.
        String::from_utf8(key).map_err(|_| KeyError::Header("not ASCII"))
    }

    /// The key.
    pub fn as_str(&self) -> &str {
        &self.key
    }

    /// The `Idempotency-Key` header value that carries the key.
    pub fn header_value(&self) -> &HeaderValue {
        &self.header
    }
}

impl std::fmt::Display for IntentKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.key)
    }
}

/// The server's key rule: 1 to [`KEY_BYTES_MAX`] bytes of printable ASCII.
fn check_key(key: &[u8]) -> Result<(), KeyError> {
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    if key.len() > KEY_BYTES_MAX {
        return Err(KeyError::TooLong { length: key.len() });
    }
    match key.iter().position(|byte| !(0x20..=0x7e).contains(byte)) {
        Some(position) => Err(KeyError::Byte {
            byte: key[position],
            position,
        }),
        None => Ok(()),
    }
}

/// The bare key when a bare header reads back unchanged, else an sf-string.
fn header_value(key: &str) -> HeaderValue {
    let reads_back_bare = !key.starts_with('"') && !key.starts_with(' ') && !key.ends_with(' ');
    let text = if reads_back_bare {
        key.to_owned()
    } else {
        let mut quoted = String::with_capacity(key.len() + 2);
        quoted.push('"');
        for character in key.chars() {
            if character == '"' || character == '\\' {
                quoted.push('\\');
            }
            quoted.push(character);
        }
        quoted.push('"');
        quoted
    };
    // Printable ASCII, with quotes and backslashes, is a valid header value.
    HeaderValue::from_str(&text).expect("printable ASCII is a valid header value")
}

/// RFC 8941 section 4.2.5: `"`, printable ASCII with `\"` and `\\`
/// escapes, `"`, and nothing after it.
fn unquote_sf_string(quoted: &[u8]) -> Result<Vec<u8>, KeyError> {
    let mut key = Vec::with_capacity(quoted.len());
    let mut bytes = quoted.iter().copied().skip(1);
    loop {
        match bytes.next() {
            None => return Err(KeyError::Header("no closing quote")),
            Some(b'"') => break,
            Some(b'\\') => match bytes.next() {
                Some(escaped @ (b'"' | b'\\')) => key.push(escaped),
                _ => return Err(KeyError::Header("only \\\" and \\\\ may be escaped")),
            },
            Some(byte) => key.push(byte),
        }
    }
    if bytes.next().is_some() {
        return Err(KeyError::Header("nothing may follow the closing quote"));
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the server reads from the header this crate sends.
    fn server_reads(key: &IntentKey) -> String {
        idem_http::key_header::parse_key(key.header_value().as_bytes())
            .expect("the server accepts every key this crate builds")
            .as_str()
            .to_owned()
    }

    #[test]
    fn a_derived_key_joins_its_parts_and_the_server_reads_it_unchanged() {
        let key = IntentKey::from_parts(&["label", "918273", "1", "v1"]).unwrap();
        assert_eq!(key.as_str(), "label:918273:1:v1");
        assert_eq!(key.header_value(), "label:918273:1:v1");
        assert_eq!(server_reads(&key), key.as_str());
    }

    #[test]
    fn keys_a_bare_header_would_change_are_sent_quoted() {
        for raw in [" padded ", "\"quoted", " back\\slash \"", "trailing "] {
            let key = IntentKey::new(raw).unwrap();
            assert!(key.header_value().as_bytes().starts_with(b"\""), "{raw:?}");
            assert_eq!(server_reads(&key), raw);
            assert_eq!(IntentKey::from_header(key.header_value()).unwrap(), key);
        }
    }

    #[test]
    fn keys_the_server_would_refuse_are_refused_when_built() {
        assert_eq!(IntentKey::new(""), Err(KeyError::Empty));
        assert_eq!(
            IntentKey::new("k".repeat(KEY_BYTES_MAX + 1)),
            Err(KeyError::TooLong { length: 256 })
        );
        assert!(IntentKey::new("k".repeat(KEY_BYTES_MAX)).is_ok());
        assert_eq!(
            IntentKey::new("tab\there"),
            Err(KeyError::Byte {
                byte: b'\t',
                position: 3
            })
        );
        assert!(matches!(IntentKey::new("é"), Err(KeyError::Byte { .. })));
        assert_eq!(IntentKey::from_parts(&["a", ""]), Err(KeyError::Empty));
        assert_eq!(
            IntentKey::from_parts(&["order", "1:2"]),
            Err(KeyError::SeparatorInPart { index: 1 })
        );
        assert_eq!(IntentKey::from_parts::<&str>(&[]), Err(KeyError::PartCount));
        assert_eq!(
            IntentKey::from_parts(&["p"; KEY_PARTS_MAX + 1]),
            Err(KeyError::PartCount)
        );
        let long_part = "x".repeat(200);
        assert!(matches!(
            IntentKey::from_parts(&[long_part.as_str(), long_part.as_str()]),
            Err(KeyError::TooLong { .. })
        ));
    }

    #[test]
    fn header_values_are_read_as_the_server_reads_them() {
        let read = |raw: &str| IntentKey::from_header(&HeaderValue::from_str(raw).unwrap());
        assert_eq!(read("\"a\\\"b\"").unwrap().as_str(), "a\"b");
        assert_eq!(read("  bare  ").unwrap().as_str(), "bare");
        for bad in ["\"open", "\"a\\nb\"", "\"a\";p=1", "\"\""] {
            assert!(read(bad).is_err(), "{bad:?}");
            assert!(idem_http::key_header::parse_key(bad.as_bytes()).is_err(), "{bad:?}");
        }
    }

    proptest::proptest! {
        /// Every printable-ASCII key of a valid length is built, and the
        /// server reads exactly that key from its header.
        #[test]
        fn every_valid_key_reaches_the_server_unchanged(raw in "[ -~]{1,255}") {
            let key = IntentKey::new(raw.clone()).unwrap();
            proptest::prop_assert_eq!(server_reads(&key), raw);
        }
    }
}
