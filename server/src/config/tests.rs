//! The configuration as a whole: loading, environment overrides, and every
//! section's refusals, each naming its field.

use super::*;
use crate::admission::ADMISSION_WORKERS_DEFAULT;
use crate::auth::token_sha256;
use crate::serving::{LISTEN_DEFAULT, PREFER_WAIT_WAITERS_LIMIT, PREFER_WAIT_WAITERS_PER_KEY_LIMIT};
use store_core::waiting::WAITERS_PER_KEY_MAX_DEFAULT;
use store_postgres::SslMode;
use store_registry::{LabelsKind, StoreKind};

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn refusal(pairs: &[(&str, &str)]) -> String {
    Config::load(None, env(pairs)).expect_err("refused").to_string()
}

#[test]
fn the_default_config_is_valid_and_has_only_the_demo_caller() {
    let config = Config::load(None, Vec::new()).unwrap();
    assert_eq!(config.callers, vec![CallerConfig::demo()]);
    assert!(config.has_demo_caller());
    assert_eq!(config.store.kind, StoreKind::Embedded);
    assert_eq!(config.listen_addr().unwrap().to_string(), LISTEN_DEFAULT);
}

#[test]
fn environment_overrides_reach_every_kind_of_field() {
    let config = Config::load(
        None,
        env(&[
            ("IDEM__SERVER__LISTEN", "127.0.0.1:0"),
            ("IDEM__POLICY__LEASE_MS", "45000"),
            ("IDEM__STORE__KIND", "redis"),
            ("IDEM__STORE__REDIS__URLS", r#"["redis://127.0.0.1:7000"]"#),
            ("IDEM__STORE__REDIS__KEY_PREFIX", r#""123""#),
            ("IDEM__CARRIER__SIMULATOR__ERROR_RATE", "0.25"),
            (
                "IDEM__CALLERS",
                &format!(r#"[{{id = "a", token_sha256 = "{}"}}]"#, token_sha256("t")),
            ),
            ("UNRELATED", "x"),
        ]),
    )
    .unwrap();
    assert_eq!(config.server.listen, "127.0.0.1:0");
    assert_eq!(config.policy.lease_ms(), 45_000);
    assert_eq!(config.store.kind, StoreKind::Redis);
    assert_eq!(config.store.redis.urls, vec!["redis://127.0.0.1:7000".to_owned()]);
    assert_eq!(config.store.redis.key_prefix, "123");
    assert_eq!(config.carrier.simulator.error_rate, 0.25);
    assert_eq!(config.callers[0].id, "a");
    assert!(!config.has_demo_caller());
}

#[test]
fn admission_workers_default_to_half_the_postgres_pool_when_unbatched_and_a_configured_number_wins() {
    let workers = |pairs: &[(&str, &str)]| Config::load(None, env(pairs)).unwrap().admission().workers();
    assert_eq!(workers(&[]), ADMISSION_WORKERS_DEFAULT);
    let redis = [
        ("IDEM__STORE__KIND", "redis"),
        ("IDEM__STORE__REDIS__URLS", r#"["redis://127.0.0.1:7000"]"#),
    ];
    assert_eq!(workers(&redis), ADMISSION_WORKERS_DEFAULT);
    let postgres = |extra: &[(&'static str, &'static str)]| {
        let mut pairs = vec![
            ("IDEM__STORE__KIND", "postgres"),
            ("IDEM__STORE__POSTGRES__URL", "postgres://idem@127.0.0.1:5432/idem"),
        ];
        pairs.extend_from_slice(extra);
        workers(&pairs)
    };
    assert_eq!(
        postgres(&[]),
        ADMISSION_WORKERS_DEFAULT,
        "batched writes hold no connection each"
    );
    let unbatched = ("IDEM__STORE__POSTGRES__BATCH_ITEMS_MAX", "1");
    assert_eq!(postgres(&[unbatched]), 8, "half the default pool of 16");
    assert_eq!(postgres(&[unbatched, ("IDEM__STORE__POSTGRES__POOL_SIZE", "40")]), 20);
    assert_eq!(postgres(&[unbatched, ("IDEM__STORE__POSTGRES__POOL_SIZE", "1")]), 1);
    assert_eq!(postgres(&[unbatched, ("IDEM__SERVER__ADMISSION__WORKERS", "30")]), 30);
    assert_eq!(postgres(&[("IDEM__SERVER__ADMISSION__WORKERS", "30")]), 30);
    assert!(refusal(&[("IDEM__SERVER__ADMISSION__WORKERS", "0")]).contains("server.admission.workers"));
}

#[test]
fn prefer_wait_is_bounded_by_its_cap_and_the_request_budget() {
    let off = Config::load(None, env(&[("IDEM__SERVER__PREFER_WAIT_MAX_S", "0")])).unwrap();
    assert_eq!(off.server.prefer_wait_applied_max_s(), 0);
    let above_cap = format!("{}", idem_http::WAIT_CAP_S_MAX + 1);
    assert!(refusal(&[("IDEM__SERVER__PREFER_WAIT_MAX_S", &above_cap)]).contains("server.prefer_wait_max_s"));
    let at_budget = Config::load(
        None,
        env(&[
            ("IDEM__SERVER__PREFER_WAIT_MAX_S", "30"),
            ("IDEM__SERVER__REQUEST_TIMEOUT_MS", "30000"),
        ]),
    )
    .unwrap();
    assert_eq!(
        at_budget.server.prefer_wait_applied_max_s(),
        29,
        "a whole second under the budget"
    );
    let short_budget = Config::load(None, env(&[("IDEM__SERVER__REQUEST_TIMEOUT_MS", "300")])).unwrap();
    assert_eq!(
        short_budget.server.prefer_wait_applied_max_s(),
        0,
        "no whole second fits: no waiting"
    );
}

#[test]
fn the_waiter_caps_are_read_from_the_environment_and_bounded() {
    let defaults = Config::load(None, Vec::new())
        .unwrap()
        .server
        .prefer_wait_limits()
        .unwrap();
    // Half the in-flight cap in the instance, a quarter of that per caller.
    assert_eq!(
        (
            defaults.waiters_per_key_max(),
            defaults.waiters_per_instance_max(),
            defaults.waiters_per_caller_max()
        ),
        (WAITERS_PER_KEY_MAX_DEFAULT, 512, 128)
    );
    let small = Config::load(None, env(&[("IDEM__SERVER__IN_FLIGHT_MAX", "64")])).unwrap();
    let small = small.server.prefer_wait_limits().unwrap();
    assert_eq!(
        (
            small.waiters_per_key_max(),
            small.waiters_per_instance_max(),
            small.waiters_per_caller_max()
        ),
        (32, 32, 8),
        "the derived caps follow a smaller in-flight cap"
    );
    let configured = Config::load(
        None,
        env(&[
            ("IDEM__SERVER__PREFER_WAIT_WAITERS_PER_KEY_MAX", "2"),
            ("IDEM__SERVER__PREFER_WAIT_WAITERS_MAX", "50"),
            ("IDEM__SERVER__PREFER_WAIT_WAITERS_PER_CALLER_MAX", "5"),
        ]),
    )
    .unwrap();
    let limits = configured.server.prefer_wait_limits().unwrap();
    assert_eq!(
        (
            limits.waiters_per_key_max(),
            limits.waiters_per_instance_max(),
            limits.waiters_per_caller_max()
        ),
        (2, 50, 5)
    );
    let per_caller = "server.prefer_wait_waiters_per_caller_max";
    let per_key = "server.prefer_wait_waiters_per_key_max";
    let per_instance = "server.prefer_wait_waiters_max";
    let above_key_limit = (PREFER_WAIT_WAITERS_PER_KEY_LIMIT + 1).to_string();
    let above_instance_limit = (PREFER_WAIT_WAITERS_LIMIT + 1).to_string();
    for (pairs, field) in [
        (vec![("IDEM__SERVER__PREFER_WAIT_WAITERS_PER_KEY_MAX", "0")], per_key),
        (vec![("IDEM__SERVER__PREFER_WAIT_WAITERS_MAX", "0")], per_instance),
        (
            vec![
                (
                    "IDEM__SERVER__PREFER_WAIT_WAITERS_PER_KEY_MAX",
                    above_key_limit.as_str(),
                ),
                ("IDEM__SERVER__PREFER_WAIT_WAITERS_MAX", "99999"),
                ("IDEM__SERVER__IN_FLIGHT_MAX", "100000"),
            ],
            per_key,
        ),
        // Waiters keep their in-flight places: fewer than the in-flight cap.
        (
            vec![
                ("IDEM__SERVER__PREFER_WAIT_WAITERS_MAX", "64"),
                ("IDEM__SERVER__IN_FLIGHT_MAX", "64"),
            ],
            per_instance,
        ),
        (
            vec![("IDEM__SERVER__PREFER_WAIT_WAITERS_PER_CALLER_MAX", "0")],
            per_caller,
        ),
        // More per caller than in the whole instance (512 by default).
        (
            vec![("IDEM__SERVER__PREFER_WAIT_WAITERS_PER_CALLER_MAX", "513")],
            per_caller,
        ),
        (
            vec![("IDEM__SERVER__PREFER_WAIT_WAITERS_MAX", above_instance_limit.as_str())],
            per_instance,
        ),
        // More per key than in the whole instance.
        (
            vec![
                ("IDEM__SERVER__PREFER_WAIT_WAITERS_PER_KEY_MAX", "10"),
                ("IDEM__SERVER__PREFER_WAIT_WAITERS_MAX", "9"),
            ],
            per_key,
        ),
    ] {
        let refused = refusal(&pairs);
        assert!(refused.contains(field), "{pairs:?}: {refused}");
    }
}

#[test]
fn refusals_name_the_field() {
    assert!(refusal(&[("IDEM__SERVER__LISTN", "x")]).contains("listn"));
    assert!(refusal(&[("IDEM__SERVER__LISTEN", "nowhere")]).contains("server.listen"));
    assert!(refusal(&[("IDEM__STORE__KIND", "mongodb")]).contains("mongodb"));
    assert!(refusal(&[("IDEM__CALLERS", "[]")]).contains("callers"));
    assert!(refusal(&[("IDEM__CARRIER__SIMULATOR__ERROR_RATE", "2")]).contains("carrier.simulator.error_rate"));
    assert!(refusal(&[("IDEM__CARRIER__RETRIES_MAX", "11")]).contains("carrier.retries_max"));
    assert!(refusal(&[("IDEM__CARRIER__RETRY_BACKOFF_MS", "0")]).contains("carrier.retry_backoff_ms"));
    assert!(Config::load(None, env(&[("IDEM__CARRIER__RETRIES_MAX", "0")])).is_ok());
    assert!(refusal(&[("IDEM__STORE__KIND", "postgres")]).contains("store.postgres.url"));
    assert!(refusal(&[("IDEM__SWEEPER__BATCH_MAX", "0")]).contains("sweeper.batch_max"));
    assert!(refusal(&[("IDEM__STORE__EMBEDDED__MEMTABLE_BYTES", "1000")]).contains("store.embedded.memtable_bytes"));
    assert!(
        refusal(&[("IDEM__STORE__EMBEDDED__JOURNAL_BYTES_MAX", "1048576")])
            .contains("store.embedded.journal_bytes_max")
    );
    assert!(refusal(&[("IDEM__STORE__EMBEDDED__BATCH_ITEMS_MAX", "0")]).contains("store.embedded.batch_items_max"));
    assert!(
        refusal(&[("IDEM__STORE__EMBEDDED__BATCHES_IN_FLIGHT_MAX", "0")])
            .contains("store.embedded.batches_in_flight_max")
    );
    assert!(
        refusal(&[("IDEM__STORE__FOUNDATIONDB__BATCH_ITEMS_MAX", "65")]).contains("store.foundationdb.batch_items_max")
    );
    assert!(
        refusal(&[("IDEM__STORE__FOUNDATIONDB__BATCHES_IN_FLIGHT_MAX", "17")])
            .contains("store.foundationdb.batches_in_flight_max")
    );
}

/// Claims are batched on FoundationDB by default and not on the embedded
/// engine; each section sets its own, 1 turning batching off.
#[test]
fn claim_batching_is_an_engine_setting_on_for_foundationdb_by_default() {
    let defaults = Config::load(None, Vec::new()).unwrap();
    assert_eq!(defaults.store.embedded.batch_items_max, 1);
    assert_eq!(
        defaults.store.foundationdb.batch_items_max,
        store_fdb::CLAIM_BATCH_ITEMS_MAX_DEFAULT_FOUNDATIONDB
    );
    assert_eq!(
        defaults.store.foundationdb.batches_in_flight_max,
        store_fdb::CLAIM_BATCHES_IN_FLIGHT_DEFAULT
    );
    let set = Config::load(
        None,
        env(&[
            ("IDEM__STORE__EMBEDDED__BATCH_ITEMS_MAX", "16"),
            ("IDEM__STORE__EMBEDDED__BATCHES_IN_FLIGHT_MAX", "3"),
            ("IDEM__STORE__FOUNDATIONDB__BATCH_ITEMS_MAX", "1"),
        ]),
    )
    .unwrap();
    let embedded = set.store.embedded.claim_batch_limits().unwrap().expect("batched");
    assert_eq!((embedded.items_max(), embedded.in_flight_max()), (16, 3));
    assert_eq!(
        set.store.foundationdb.claim_batch_limits().unwrap(),
        None,
        "1 turns it off"
    );
}

/// The backends' sections are their store crates' own config types;
/// a misspelt field is refused there too, the flattened ones (the
/// embedded sizes, the Redis TLS files) included, and the fields only
/// code sets (faults, WAIT, the idle-in-transaction timeout) are not in
/// the file.
#[test]
fn backend_sections_refuse_unknown_fields() {
    for (variable, field) in [
        ("IDEM__STORE__EMBEDDED__CACHE_BYTE", "cache_byte"),
        ("IDEM__STORE__EMBEDDED__FAULTS", "faults"),
        ("IDEM__STORE__REDIS__CA_FIL", "ca_fil"),
        ("IDEM__STORE__REDIS__WAIT", "wait"),
        (
            "IDEM__STORE__POSTGRES__IDLE_IN_TRANSACTION_TIMEOUT_MS",
            "idle_in_transaction_timeout_ms",
        ),
        ("IDEM__STORE__FOUNDATIONDB__PREFIX", "prefix"),
    ] {
        let message = refusal(&[(variable, "1")]);
        assert!(message.contains(field), "{variable}: {message}");
    }
    let config = Config::load(
        None,
        env(&[
            ("IDEM__STORE__EMBEDDED__CACHE_BYTES", "2097152"),
            ("IDEM__STORE__EMBEDDED__DURABILITY", "sync_all"),
            ("IDEM__STORE__REDIS__CA_FILE", r#""""#),
            ("IDEM__STORE__POSTGRES__POOL_WAIT_TIMEOUT_MS", "250"),
            ("IDEM__STORE__FOUNDATIONDB__KEY_PREFIX", "app"),
            ("IDEM__STORE__FOUNDATIONDB__CLUSTER_FILE", r#""""#),
        ]),
    )
    .unwrap();
    assert_eq!(config.store.embedded.sizes.cache_bytes, 2_097_152);
    assert_eq!(config.store.embedded.durability, store_fdb::Durability::SyncAll);
    assert_eq!(config.store.redis.tls.ca_file, None, "an empty file name is unset");
    assert_eq!(config.store.postgres.pool_wait_timeout_ms, 250);
    assert_eq!(
        config.store.foundationdb.prefix,
        store_fdb::KeyPrefix::Bytes(b"app".to_vec())
    );
    assert_eq!(config.store.foundationdb.cluster_file, None);
}

#[test]
fn every_store_kind_is_named_once() {
    for kind in StoreKind::ALL {
        assert_eq!(kind.name().parse::<StoreKind>(), Ok(kind));
        let config = Config::load(None, env(&[("IDEM__STORE__KIND", kind.name())]));
        // Every name is a config value; some kinds need more settings.
        if let Err(error) = config {
            assert!(!error.to_string().contains("unknown variant"), "{kind}: {error}");
        }
    }
    assert!(
        StoreKind::SELF_STARTED
            .iter()
            .all(|kind| kind.cargo_feature().is_none())
    );
}

#[test]
fn memory_records_keep_labels_apart_like_redis() {
    let memory = ("IDEM__STORE__KIND", "memory");
    let config = Config::load(None, env(&[memory])).unwrap();
    assert_eq!(config.store.labels_kind(), LabelsKind::Embedded);
    let with_records = refusal(&[memory, ("IDEM__STORE__LABELS", "with_records")]);
    assert!(with_records.contains("store.labels"), "{with_records}");
}

#[test]
fn labels_go_only_where_a_team_would_put_them() {
    let redis = ("IDEM__STORE__REDIS__URLS", r#"["redis://127.0.0.1:6379"]"#);
    let postgres = ("IDEM__STORE__POSTGRES__URL", "postgres://idem@127.0.0.1/idem");
    let with = |pairs: &[(&str, &str)]| Config::load(None, env(pairs)).map(|config| config.store.labels_kind());
    assert_eq!(with(&[]).unwrap(), LabelsKind::WithRecords);
    assert_eq!(
        with(&[("IDEM__STORE__KIND", "redis"), redis]).unwrap(),
        LabelsKind::Embedded
    );
    let split = [
        ("IDEM__STORE__KIND", "redis"),
        ("IDEM__STORE__LABELS", "postgres"),
        redis,
        postgres,
    ];
    assert_eq!(with(&split).unwrap(), LabelsKind::Postgres);
    // Labels in PostgreSQL need its URL; labels apart from records that
    // could hold them in one transaction are refused.
    let no_url = refusal(&[
        ("IDEM__STORE__KIND", "redis"),
        ("IDEM__STORE__LABELS", "postgres"),
        redis,
    ]);
    assert!(no_url.contains("store.postgres.url"), "{no_url}");
    let apart = refusal(&[("IDEM__STORE__LABELS", "postgres"), postgres]);
    assert!(apart.contains("store.labels"), "{apart}");
    let redis_with_records = refusal(&[
        ("IDEM__STORE__KIND", "redis"),
        ("IDEM__STORE__LABELS", "with_records"),
        redis,
    ]);
    assert!(redis_with_records.contains("store.labels"), "{redis_with_records}");
}

#[test]
fn a_lease_that_does_not_outlast_the_carrier_budget_and_its_commit_is_refused() {
    for lease_ms in ["20000", "20001", "24999"] {
        let message = refusal(&[
            ("IDEM__POLICY__LEASE_MS", lease_ms),
            ("IDEM__CARRIER__TIMEOUT_MS", "20000"),
        ]);
        assert!(message.contains("policy.lease_ms"), "{lease_ms}: {message}");
        assert!(
            message.contains("25000"),
            "{lease_ms}: names the lease that would do: {message}"
        );
    }
    assert!(Config::load(None, env(&[("IDEM__POLICY__LEASE_MS", "25000")])).is_ok());
    // A short budget still needs the floor of the margin.
    let short = [("IDEM__POLICY__LEASE_MS", "649"), ("IDEM__CARRIER__TIMEOUT_MS", "400")];
    assert!(refusal(&short).contains("policy.lease_ms"));
    let enough = [("IDEM__POLICY__LEASE_MS", "650"), ("IDEM__CARRIER__TIMEOUT_MS", "400")];
    assert!(Config::load(None, env(&enough)).is_ok());
}

#[test]
fn caller_tokens_must_be_digests_and_distinct() {
    let bad = r#"[{id = "a", token_sha256 = "demo-token"}]"#;
    assert!(refusal(&[("IDEM__CALLERS", bad)]).contains("callers.token_sha256"));
    let twice = format!(
        r#"[{{id = "a", token_sha256 = "{0}"}}, {{id = "b", token_sha256 = "{0}"}}]"#,
        token_sha256("same")
    );
    assert!(refusal(&[("IDEM__CALLERS", &twice)]).contains("appears twice"));
    // A token being rotated out is a digest like the current one, and
    // no other caller's.
    let retiring_twice = format!(
        r#"[{{id = "a", token_sha256 = "{0}"}}, {{id = "b", token_sha256 = "{1}", retiring_token_sha256 = ["{0}"]}}]"#,
        token_sha256("one"),
        token_sha256("two")
    );
    assert!(refusal(&[("IDEM__CALLERS", &retiring_twice)]).contains("appears twice"));
    let retiring_bad = format!(
        r#"[{{id = "a", token_sha256 = "{}", retiring_token_sha256 = ["x"]}}]"#,
        token_sha256("one")
    );
    assert!(refusal(&[("IDEM__CALLERS", &retiring_bad)]).contains("callers.token_sha256"));
}

#[test]
fn tls_settings_that_contradict_each_other_are_refused() {
    // Inbound: both files or neither.
    assert!(refusal(&[("IDEM__SERVER__TLS__CERT_FILE", "/etc/idem/cert.pem")]).contains("server.tls.key_file"));
    assert!(refusal(&[("IDEM__SERVER__TLS__KEY_FILE", "/etc/idem/key.pem")]).contains("server.tls.cert_file"));
    assert!(refusal(&[("IDEM__SERVER__TLS__HANDSHAKE_TIMEOUT_MS", "0")]).contains("server.tls.handshake_timeout_ms"));
    // Redis: TLS files with redis:// URLs, mixed schemes, a certificate without its key.
    let redis = ("IDEM__STORE__KIND", "redis");
    let plain_url = ("IDEM__STORE__REDIS__URLS", r#"["redis://127.0.0.1:6379"]"#);
    let tls_url = ("IDEM__STORE__REDIS__URLS", r#"["rediss://127.0.0.1:6379"]"#);
    let ca = ("IDEM__STORE__REDIS__CA_FILE", "/etc/idem/redis-ca.pem");
    assert!(refusal(&[redis, plain_url, ca]).contains("store.redis.ca_file"));
    let mixed = (
        "IDEM__STORE__REDIS__URLS",
        r#"["rediss://127.0.0.1:1", "redis://127.0.0.1:2"]"#,
    );
    assert!(refusal(&[redis, mixed, ("IDEM__STORE__REDIS__CLUSTER", "true")]).contains("store.redis.urls"));
    let cert_only = ("IDEM__STORE__REDIS__CLIENT_CERT_FILE", "/etc/idem/client.pem");
    assert!(refusal(&[redis, tls_url, ca, cert_only]).contains("store.redis.client_key_file"));
    assert!(Config::load(None, env(&[redis, tls_url, ca])).is_ok());
    // PostgreSQL: sslmode in one place, a CA file exactly when it is TLS.
    let postgres = ("IDEM__STORE__KIND", "postgres");
    let url = ("IDEM__STORE__POSTGRES__URL", "postgres://idem@db/idem");
    let url_sslmode = ("IDEM__STORE__POSTGRES__URL", "postgres://idem@db/idem?sslmode=require");
    assert!(refusal(&[postgres, url_sslmode]).contains("store.postgres.url"));
    let verify_full = ("IDEM__STORE__POSTGRES__SSLMODE", "verify-full");
    let pg_ca = ("IDEM__STORE__POSTGRES__CA_FILE", "/etc/idem/pg-ca.pem");
    assert!(refusal(&[postgres, url, verify_full]).contains("store.postgres.ca_file"));
    assert!(refusal(&[postgres, url, pg_ca]).contains("store.postgres.ca_file"));
    assert!(refusal(&[postgres, url, ("IDEM__STORE__POSTGRES__SSLMODE", "verify-ca")]).contains("verify-ca"));
    let config = Config::load(None, env(&[postgres, url, verify_full, pg_ca])).unwrap();
    assert_eq!(config.store.postgres.ssl_mode, SslMode::VerifyFull);
    // Carrier: https:// is allowed, its CA file only with https://.
    let https = ("IDEM__CARRIER__URL", "https://carrier.example");
    let carrier_ca = ("IDEM__CARRIER__CA_FILE", "/etc/idem/carrier-ca.pem");
    assert!(Config::load(None, env(&[https, carrier_ca])).is_ok());
    assert!(refusal(&[carrier_ca]).contains("carrier.ca_file"));
    assert!(refusal(&[("IDEM__CARRIER__URL", "ftp://carrier")]).contains("carrier.url"));
}

#[test]
fn the_example_file_loads() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config.example.toml");
    let config = Config::load(Some(&path), Vec::new()).unwrap();
    assert_eq!(config.store.kind, StoreKind::Embedded);
    // The waiter caps it shows are the defaults it says they are.
    let defaults = ServerConfig::default();
    assert_eq!(
        config.server.prefer_wait_limits().unwrap(),
        defaults.prefer_wait_limits().unwrap()
    );
    // So are the claim batch settings of the FDB-style engines.
    let (embedded, foundationdb) = (
        store_fdb::EmbeddedConfig::default(),
        store_fdb::FoundationDbConfig::default(),
    );
    assert_eq!(
        (
            config.store.embedded.batch_items_max,
            config.store.embedded.batches_in_flight_max
        ),
        (embedded.batch_items_max, embedded.batches_in_flight_max)
    );
    assert_eq!(
        (
            config.store.foundationdb.batch_items_max,
            config.store.foundationdb.batches_in_flight_max
        ),
        (foundationdb.batch_items_max, foundationdb.batches_in_flight_max)
    );
}

/// The fleet configs DEPLOYMENT.md shows are configs the server takes.
#[test]
fn the_deployment_examples_load() {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    for (file, kind, labels) in [
        ("fleet-postgres.toml", StoreKind::Postgres, LabelsKind::WithRecords),
        ("fleet-redis-postgres.toml", StoreKind::Redis, LabelsKind::Postgres),
        (
            "fleet-foundationdb.toml",
            StoreKind::Foundationdb,
            LabelsKind::WithRecords,
        ),
    ] {
        let config =
            Config::load(Some(&deploy.join(file)), Vec::new()).unwrap_or_else(|error| panic!("{file}: {error}"));
        assert_eq!(
            (config.store.kind, config.store.labels_kind()),
            (kind, labels),
            "{file}"
        );
        assert!(!config.has_demo_caller(), "{file} keeps the public demo caller");
    }
}
