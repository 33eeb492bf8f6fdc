//! Secrets never reach output: a password in a store URL is not echoed by
//! a TOML syntax error, a config refusal or the config's `Debug` form, and
//! `server hash-token` reads the token from stdin or a file, never from the
//! command line (where `ps` and the shell history keep it).

use server::auth::token_sha256;
use server::config::Config;
use std::path::Path;
use std::process::Stdio;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

const POSTGRES_PASSWORD: &str = "pg-hunter2-secret";
const REDIS_PASSWORD: &str = "redis-hunter2-secret";
const CARRIER_PASSWORD: &str = "carrier-hunter2-secret";

fn load(pairs: &[(&str, String)]) -> Result<Config, server::config::ConfigError> {
    Config::load(
        None,
        pairs.iter().map(|(name, value)| (name.to_string(), value.clone())),
    )
}

fn assert_no_secret(text: &str, context: &str) {
    for secret in [POSTGRES_PASSWORD, REDIS_PASSWORD, CARRIER_PASSWORD] {
        assert!(!text.contains(secret), "{context} shows a password: {text}");
    }
}

/// A config file whose second line holds a password and a syntax error.
fn config_with_a_syntax_error_beside_a_password(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("broken.toml");
    let text =
        format!("[store.postgres]\nurl = \"postgres://idem:{POSTGRES_PASSWORD}@db.internal/idem\" pool_size = 4\n");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn a_toml_syntax_error_names_the_line_without_echoing_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = config_with_a_syntax_error_beside_a_password(dir.path());
    let error = Config::load(Some(&path), Vec::new()).expect_err("not TOML").to_string();
    assert_no_secret(&error, "the syntax error");
    assert!(error.contains("line 2"), "names the line: {error}");
}

#[test]
fn config_refusals_do_not_echo_urls_with_passwords() {
    let cases = [
        // The brackets forgotten: a string where a list belongs.
        (
            "IDEM__STORE__REDIS__URLS",
            format!("redis://:{REDIS_PASSWORD}@cache.internal:6379"),
        ),
        // A URL where a section belongs.
        (
            "IDEM__STORE__POSTGRES",
            format!("\"postgres://idem:{POSTGRES_PASSWORD}@db.internal/idem\""),
        ),
    ];
    for (variable, value) in cases {
        let error = load(&[(variable, value)]).expect_err("refused").to_string();
        assert_no_secret(&error, variable);
    }
}

#[test]
fn the_config_debug_form_hides_passwords_and_keeps_the_rest() {
    let config = load(&[
        ("IDEM__STORE__KIND", "postgres".to_owned()),
        (
            "IDEM__STORE__POSTGRES__URL",
            format!("postgres://idem:{POSTGRES_PASSWORD}@db.internal:5432/idem"),
        ),
        (
            "IDEM__STORE__REDIS__URLS",
            format!("[\"redis://default:{REDIS_PASSWORD}@cache.internal:6379\"]"),
        ),
        (
            "IDEM__CARRIER__URL",
            format!("http://labels:{CARRIER_PASSWORD}@carrier.internal:9090"),
        ),
    ])
    .expect("valid");
    let shown = format!("{config:?}");
    assert_no_secret(&shown, "Debug");
    for kept in [
        "db.internal:5432/idem",
        "cache.internal:6379",
        "carrier.internal:9090",
        "idem:",
    ] {
        assert!(shown.contains(kept), "{kept} missing from {shown}");
    }
    assert_eq!(
        config.store.postgres.url,
        format!("postgres://idem:{POSTGRES_PASSWORD}@db.internal:5432/idem")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_refusing_a_broken_config_prints_no_password() {
    let dir = tempfile::tempdir().unwrap();
    let path = config_with_a_syntax_error_beside_a_password(dir.path());
    let output = Command::new(env!("CARGO_BIN_EXE_server"))
        .args(["--config", path.to_str().unwrap()])
        .current_dir(dir.path())
        .output()
        .await
        .unwrap();
    let printed = String::from_utf8_lossy(&output.stderr).into_owned() + &String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(2), "{printed}");
    assert_no_secret(&printed, "the refusal");
    assert!(printed.contains("line 2"), "{printed}");
}

/// Runs `server hash-token ARGS` with `stdin`; the exit code and what it printed.
async fn hash_token(args: &[&str], stdin: &[u8]) -> (Option<i32>, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_server"))
        .arg("hash-token")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin).await.unwrap();
    drop(input);
    let output = child.wait_with_output().await.unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_token_reads_the_token_from_stdin_or_a_file_never_argv() {
    let token = "tok-3f9a1c";
    let expected = token_sha256(token);
    let (code, stdout, stderr) = hash_token(&[], format!("{token}\n").as_bytes()).await;
    assert_eq!((code, stdout.trim()), (Some(0), expected.as_str()), "stdin: {stderr}");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, format!("{token}\r\n")).unwrap();
    let (code, stdout, stderr) = hash_token(&["--token-file", file.to_str().unwrap()], b"").await;
    assert_eq!((code, stdout.trim()), (Some(0), expected.as_str()), "file: {stderr}");

    let (code, stdout, stderr) = hash_token(&[token], b"").await;
    assert_eq!(
        code,
        Some(2),
        "a token on the command line is refused: {stdout}{stderr}"
    );
    assert!(
        !stdout.contains(token) && !stderr.contains(token),
        "and not echoed: {stdout}{stderr}"
    );
    assert!(stderr.contains("stdin"), "says how instead: {stderr}");

    let (code, stdout, stderr) = hash_token(&[], b"\n").await;
    assert_eq!(code, Some(2), "an empty token is refused: {stdout}{stderr}");
    assert!(stdout.trim().is_empty(), "{stdout}");
}
