//! One redaction for every text that may carry a secret on its way to a
//! log, a terminal or an error: config refusals, the `Debug` form of the
//! server's config and of the backends' configs in it, startup errors.
//!
//! What counts as a secret here: the password of a URL
//! (`scheme://user:PASSWORD@host`) and the value of `password=` in a
//! key-value connection string (`host=db password=PASSWORD`). The rest of
//! the text (scheme, user, host, path) stays, so a message still says which
//! server it means. When in doubt it hides too much, never too little: the
//! password runs to the last `@` before the next space or quote, so a
//! password with an unescaped `@` or `/` is hidden whole.

/// What a hidden secret is replaced with.
pub const REDACTED: &str = "***";

/// `text` with every URL password and every `password=` value replaced by
/// [`REDACTED`].
pub fn redact_secrets(text: &str) -> String {
    redact_key_value_passwords(&redact_url_passwords(text))
}

/// Characters that end a URL inside a longer text.
fn ends_a_url(character: char) -> bool {
    character.is_whitespace() || matches!(character, '"' | '\'' | '`' | '<' | '>')
}

fn redact_url_passwords(text: &str) -> String {
    let mut redacted = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (before, after_scheme) = rest.split_at(at + "://".len());
        redacted.push_str(before);
        let url_end = after_scheme.find(ends_a_url).unwrap_or(after_scheme.len());
        let (url, after_url) = after_scheme.split_at(url_end);
        redacted.push_str(&redact_userinfo(url));
        rest = after_url;
    }
    redacted.push_str(rest);
    redacted
}

/// `user:password@host/...` → `user:***@host/...`; anything without a
/// password is returned as it is.
fn redact_userinfo(url_after_scheme: &str) -> String {
    let Some(userinfo_end) = url_after_scheme.rfind('@') else {
        return url_after_scheme.to_owned();
    };
    let userinfo = &url_after_scheme[..userinfo_end];
    match userinfo.find(':') {
        Some(colon) => format!("{}:{REDACTED}{}", &userinfo[..colon], &url_after_scheme[userinfo_end..]),
        None => url_after_scheme.to_owned(),
    }
}

fn redact_key_value_passwords(text: &str) -> String {
    const KEY: &str = "password=";
    let lowercase = text.to_ascii_lowercase();
    let mut redacted = String::with_capacity(text.len());
    let mut copied_to = 0;
    let mut search_from = 0;
    while let Some(found) = lowercase[search_from..].find(KEY) {
        let value_start = search_from + found + KEY.len();
        let value_end = key_value_end(text, value_start);
        redacted.push_str(&text[copied_to..value_start]);
        redacted.push_str(REDACTED);
        copied_to = value_end;
        search_from = value_end;
    }
    redacted.push_str(&text[copied_to..]);
    redacted
}

/// Where a `password=` value starting at `start` ends: at its closing quote
/// when it is quoted (libpq's `password='a b'`), else at the next space or quote.
fn key_value_end(text: &str, start: usize) -> usize {
    let value = &text[start..];
    if let Some(quote) = value.chars().next().filter(|first| matches!(first, '\'' | '"')) {
        let quoted = &value[1..];
        return quoted.find(quote).map_or(text.len(), |close| start + 1 + close + 1);
    }
    value.find(ends_a_url).map_or(text.len(), |end| start + end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_passwords_are_hidden_and_the_rest_kept() {
        let cases = [
            (
                "postgres://idem:s3cret@db:5432/idem",
                "postgres://idem:***@db:5432/idem",
            ),
            ("redis://:s3cret@cache:6379", "redis://:***@cache:6379"),
            ("http://labels:s3cret@carrier/x?y=1", "http://labels:***@carrier/x?y=1"),
            ("postgres://idem@db/idem", "postgres://idem@db/idem"),
            ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
            ("postgres://u:p@ss/w@rd@db/idem", "postgres://u:***@db/idem"),
            (
                "a \"redis://:one@a\" and 'redis://u:two@b:1' end",
                "a \"redis://:***@a\" and 'redis://u:***@b:1' end",
            ),
            ("no url here", "no url here"),
        ];
        for (text, expected) in cases {
            assert_eq!(redact_secrets(text), expected, "{text}");
        }
    }

    #[test]
    fn key_value_passwords_are_hidden() {
        assert_eq!(
            redact_secrets("host=db password=s3cret user=idem"),
            "host=db password=*** user=idem"
        );
        assert_eq!(
            redact_secrets("host=db PASSWORD='s 3cret' x=1"),
            "host=db PASSWORD=*** x=1"
        );
        assert_eq!(redact_secrets("a password=\"s3cret\" b"), "a password=*** b");
        assert_eq!(redact_secrets("password="), "password=***");
    }
}
