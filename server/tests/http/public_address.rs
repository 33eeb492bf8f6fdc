//! The development caller on a public address. Its token is public (it is
//! in the README), so a server that accepts it on anything but loopback is
//! open to everyone: the config is refused unless the operator says, in the
//! config, that this is what they want. The check compares digests as
//! bytes, so the demo digest written in upper-case hex is still the demo
//! caller.

use server::auth::{DEMO_TOKEN, token_sha256};
use server::config::{Config, ConfigError};

/// The field a refusal names, and the flag that accepts the risk.
const ALLOW_FIELD: &str = "server.allow_demo_caller_on_public_address";
/// A carrier of its own: a public address refuses the in-process simulator.
const CARRIER_URL: &str = "http://carrier.internal:9090";

fn load(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
    Config::load(
        None,
        pairs.iter().map(|(name, value)| (name.to_string(), value.to_string())),
    )
}

fn demo_caller_written_as(digest: &str) -> String {
    format!(r#"[{{id = "dev", token_sha256 = "{digest}"}}]"#)
}

fn assert_refused_naming_the_flag(result: Result<Config, ConfigError>, case: &str) {
    match result {
        Err(ConfigError::Field { field, message }) => {
            assert_eq!(field, ALLOW_FIELD, "{case}: {message}");
            assert!(message.contains(DEMO_TOKEN), "{case}: says which token: {message}");
        }
        other => panic!("{case}: must be refused naming {ALLOW_FIELD}, got {other:?}"),
    }
}

#[test]
fn the_default_demo_caller_on_a_public_address_is_refused() {
    for listen in ["0.0.0.0:8080", "[::]:8080", "10.1.2.3:8080", "192.168.0.7:0"] {
        assert_refused_naming_the_flag(load(&[("IDEM__SERVER__LISTEN", listen)]), listen);
    }
}

#[test]
fn the_demo_digest_in_upper_case_hex_is_still_the_demo_caller() {
    let upper = token_sha256(DEMO_TOKEN).to_ascii_uppercase();
    let callers = demo_caller_written_as(&upper);
    assert_refused_naming_the_flag(
        load(&[("IDEM__SERVER__LISTEN", "0.0.0.0:8080"), ("IDEM__CALLERS", &callers)]),
        "upper-case demo digest",
    );
    let on_loopback =
        load(&[("IDEM__SERVER__LISTEN", "127.0.0.1:8080"), ("IDEM__CALLERS", &callers)]).expect("loopback is allowed");
    assert!(on_loopback.has_demo_caller(), "the startup warning must see it too");
}

#[test]
fn the_flag_accepts_the_demo_caller_on_a_public_address() {
    let config = load(&[
        ("IDEM__SERVER__LISTEN", "0.0.0.0:8080"),
        ("IDEM__SERVER__ALLOW_DEMO_CALLER_ON_PUBLIC_ADDRESS", "true"),
        ("IDEM__CARRIER__URL", CARRIER_URL),
    ])
    .expect("accepted by configuration");
    assert!(config.has_demo_caller());
}

#[test]
fn loopback_and_real_callers_need_no_flag() {
    for listen in ["127.0.0.1:8080", "[::1]:8080", "127.0.0.2:0"] {
        load(&[("IDEM__SERVER__LISTEN", listen)]).unwrap_or_else(|error| panic!("{listen}: {error}"));
    }
    let own = demo_caller_written_as(&token_sha256("a-real-secret"));
    let config = load(&[
        ("IDEM__SERVER__LISTEN", "0.0.0.0:8080"),
        ("IDEM__CALLERS", &own),
        ("IDEM__CARRIER__URL", CARRIER_URL),
    ])
    .expect("own callers");
    assert!(!config.has_demo_caller());
}

/// The same check on an address as such: what `App::serve` applies to the
/// listener it is given, which embedding code may have bound itself.
#[test]
fn the_check_applies_to_any_address_the_app_is_given() {
    let config = load(&[("IDEM__SERVER__LISTEN", "127.0.0.1:0")]).expect("loopback config");
    assert_refused_naming_the_flag(
        config
            .check_demo_caller_address("0.0.0.0:8080".parse().unwrap())
            .map(|()| config.clone()),
        "a listener on 0.0.0.0",
    );
    config
        .check_demo_caller_address("127.0.0.1:8080".parse().unwrap())
        .expect("loopback");
}
