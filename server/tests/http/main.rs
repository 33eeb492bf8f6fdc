//! The server's HTTP suite: a real server on an ephemeral loopback port per
//! test. `cases` runs on every backend CI has (embedded always; Redis and
//! PostgreSQL on real servers the store crates' test harnesses start;
//! FoundationDB with the server's `foundationdb` feature, on the cluster
//! scripts/test-foundationdb starts; the memory store, which the tests'
//! build of the server has through its `memory-store` feature);
//! the other modules test what does not depend on the backend.

mod carrier;
mod carrier_trust;
mod cases;
mod common;
mod forget;
mod layer;
mod limits;
mod observability;
mod one_caller_misbehaves;
mod openapi;
mod process;
mod public_address;
mod redis_out_of_memory;
mod request_context;
mod routing;
mod schemathesis;
mod secrets;
mod shutdown;
mod slow_clients;
mod tls;
mod waiting;

/// One module of `#[tokio::test]`s, one per case, on one backend.
macro_rules! cases_on {
    ($module:ident, $kind:ident, [$($case:ident),* $(,)?]) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    crate::cases::$case(server::backend::StoreKind::$kind).await
                }
            )*
        }
    };
}

/// Every case on every backend: one line per backend.
macro_rules! backend_suite {
    ($($case:ident),* $(,)?) => {
        cases_on!(embedded, Embedded, [$($case),*]);
        cases_on!(redis, Redis, [$($case),*]);
        cases_on!(postgres, Postgres, [$($case),*]);
        // Only with the server's `foundationdb` feature, on the cluster
        // scripts/test-foundationdb starts.
        #[cfg(feature = "foundationdb")]
        cases_on!(foundationdb, Foundationdb, [$($case),*]);
        // The reference store through the registry (`store.kind = "memory"`).
        cases_on!(memory, Memory, [$($case),*]);
    };
}

backend_suite!(
    first_run_creates_the_label,
    repeat_is_replayed_byte_for_byte,
    concurrent_repeat_gets_409_then_the_replay,
    waiting_repeats_get_the_first_answer,
    same_key_with_another_body_is_422,
    key_header_errors_and_the_quoted_form,
    invalid_request_frees_the_key,
    unknown_callers_are_refused,
    callers_are_isolated,
    a_new_key_for_a_labelled_parcel_buys_nothing,
    unknown_carrier_outcomes_are_retried_then_released_and_the_retry_buys_once,
    carrier_timeout_then_retry_gets_the_same_label,
    reads_and_probes,
    oversized_bodies_are_413,
);
