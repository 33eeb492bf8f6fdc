//! A token rotated without a new caller: the caller id scopes keys, labels
//! and carrier keys, so a retry that spans the rotation replays the first
//! answer and buys nothing again. Three real server processes on one store:
//! before the rotation (old token only), during it (new token, old one
//! retiring), after it (new token only).

use crate::support::backends::{BackendSetup, pair};
use crate::support::process::start_server;
use crate::support::{LabelPost, client, derived_key, label_body, unique_order_id};
use server::auth::token_sha256;
use server::backend::StoreKind;
use server::carrier::read_stats;

const OLD_TOKEN: &str = "fulfilment-token-2026-11";
const NEW_TOKEN: &str = "fulfilment-token-2026-12";

fn callers(current: &str, retiring: Option<&str>) -> String {
    let retiring = retiring
        .map(|token| format!(r#", retiring_token_sha256 = ["{}"]"#, token_sha256(token)))
        .unwrap_or_default();
    format!(
        r#"[{{id = "fulfilment", token_sha256 = "{}"{retiring}}}]"#,
        token_sha256(current)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_across_a_token_rotation_replays_and_buys_nothing_again() {
    let setup = BackendSetup::start(StoreKind::Embedded).await;
    let carrier = start_server(&["carrier", "--listen", "127.0.0.1:0"], &[], None, setup.data.path()).await;
    let http = client();
    let order_id = unique_order_id();
    let (key, body) = (derived_key(order_id, 1), label_body(order_id, 1));
    let post = |token: &'static str, url: String| {
        let (http, key, body) = (http.clone(), key.clone(), body.clone());
        async move {
            LabelPost {
                token: Some(token),
                ..LabelPost::new(&key, &body)
            }
            .send(&http, &url)
            .await
            .expect("answered")
        }
    };
    let start = |callers_setting: String| {
        let mut env = setup.env();
        env.extend([
            pair("IDEM__SERVER__LISTEN", "127.0.0.1:0"),
            pair("IDEM__CALLERS", callers_setting),
            pair("IDEM__CARRIER__URL", &carrier.url),
        ]);
        let dir = setup.data.path().to_owned();
        async move { start_server(&[], &env, None, &dir).await }
    };

    let before = start(callers(OLD_TOKEN, None)).await;
    let first = post(OLD_TOKEN, before.url.clone()).await;
    assert_eq!((first.status, first.is_replay()), (201, false), "{}", first.text());
    assert!(before.terminate().await.0.success());

    let during = start(callers(NEW_TOKEN, Some(OLD_TOKEN))).await;
    for token in [NEW_TOKEN, OLD_TOKEN] {
        let retry = post(token, during.url.clone()).await;
        assert_eq!(
            (retry.status, retry.is_replay()),
            (201, true),
            "{token}: {}",
            retry.text()
        );
        assert_eq!(
            retry.body, first.body,
            "{token}: the replay differs from the first answer"
        );
    }
    assert!(during.terminate().await.0.success());

    let after = start(callers(NEW_TOKEN, None)).await;
    assert_eq!(
        post(OLD_TOKEN, after.url.clone()).await.status,
        401,
        "a retired token still works"
    );
    let retry = post(NEW_TOKEN, after.url.clone()).await;
    assert_eq!((retry.status, retry.body.clone()), (201, first.body.clone()));
    assert!(after.terminate().await.0.success());

    let stats = read_stats(&http, &carrier.url).await.expect("carrier stats");
    assert_eq!(stats.purchases_total, 1, "{stats:?}");
    let _ = carrier.terminate().await.0;
}
