//! The middleware against a scripted HTTP peer on loopback: what each
//! attempt carried (the key, `Prefer`), how long the client paused between
//! them (read from a `ManualClock`, never slept), and what the typed API
//! made of the answers. The real Label service is in the server's
//! `client` suite; this covers what it cannot be made to send (an HTTP-date
//! `Retry-After`, a 500, a 404).

use idem_client::{GiveUpReason, IdemClient, IntentError, IntentKey, ManualClock, RetryBudget, RetryPolicy};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Longest request head the peer reads, in bytes.
const HEAD_BYTES_MAX: usize = 16 * 1024;

/// What one attempt sent.
#[derive(Debug, Clone)]
struct Seen {
    key: Option<String>,
    prefer: Option<String>,
}

/// A peer that answers the n-th request with `answers[n]` (the last one
/// again after that) and records every request's headers.
async fn scripted_peer(answers: Vec<String>) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let recording = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut connection, _)) = listener.accept().await else {
                return;
            };
            let head = read_head(&mut connection).await;
            let header = |name: &str| {
                head.lines()
                    .find_map(|line| line.split_once(':').filter(|(n, _)| n.eq_ignore_ascii_case(name)))
                    .map(|(_, value)| value.trim().to_owned())
            };
            let answer = {
                let mut seen = recording.lock().unwrap();
                seen.push(Seen {
                    key: header("idempotency-key"),
                    prefer: header("prefer"),
                });
                answers[(seen.len() - 1).min(answers.len() - 1)].clone()
            };
            let _ = connection.write_all(answer.as_bytes()).await;
            let _ = connection.shutdown().await;
        }
    });
    (url, seen)
}

/// The request head and body (the body is small and sent at once).
async fn read_head(connection: &mut tokio::net::TcpStream) -> String {
    let mut bytes = Vec::new();
    let mut buffer = [0u8; 4096];
    while !bytes.windows(4).any(|window| window == b"\r\n\r\n") && bytes.len() < HEAD_BYTES_MAX {
        let Ok(read) = connection.read(&mut buffer).await else {
            break;
        };
        if read == 0 {
            break;
        }
        bytes.extend_from_slice(&buffer[..read]);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

fn answer(status: &str, headers: &[(&str, &str)], body: &str) -> String {
    let mut text = format!(
        "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    text.push_str("\r\n");
    text.push_str(body);
    text
}

fn created(replayed: bool) -> String {
    let replay: &[(&str, &str)] = if replayed {
        &[("idempotent-replayed", "true")]
    } else {
        &[]
    };
    answer("201 Created", replay, r#"{"label_id":"L1"}"#)
}

fn client(url: &str, policy: RetryPolicy, clock: Arc<ManualClock>) -> IdemClient {
    IdemClient::builder(url).policy(policy).clock(clock).build().unwrap()
}

fn key() -> IntentKey {
    IntentKey::from_parts(&["label", "918273", "1", "v1"]).unwrap()
}

#[tokio::test]
async fn an_http_date_retry_after_is_waited_and_every_attempt_carries_the_same_key() {
    let wall_now = httpdate::parse_http_date("Wed, 21 Oct 2015 07:28:00 GMT").unwrap();
    let unavailable = answer(
        "503 Service Unavailable",
        &[("retry-after", "Wed, 21 Oct 2015 07:28:09 GMT")],
        "{}",
    );
    let (url, seen) = scripted_peer(vec![unavailable, created(true)]).await;
    let clock = Arc::new(ManualClock::starting_at(wall_now));
    let policy = RetryPolicy::builder()
        .intent_timeout(Duration::from_secs(60))
        .attempt_timeout(Duration::from_secs(5))
        .prefer_wait(Some(Duration::from_secs(3)))
        .build()
        .unwrap();
    let done = client(&url, policy, clock.clone())
        .post("/v1/labels", &key(), b"{}".to_vec())
        .await
        .unwrap();
    assert!(done.replayed && done.attempts == 2, "{done:?}");
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.iter()
            .all(|attempt| attempt.key.as_deref() == Some("label:918273:1:v1")),
        "{seen:?}"
    );
    assert_eq!(seen[0].prefer, None, "a first attempt does not ask to wait");
    assert_eq!(seen[1].prefer.as_deref(), Some("wait=3"));
    let pauses = clock.pauses();
    assert_eq!(pauses.len(), 1);
    assert!(
        pauses[0] >= Duration::from_secs(9),
        "waited the date's 9 s first: {pauses:?}"
    );
}

#[tokio::test]
async fn other_5xx_are_retried_and_other_4xx_are_not() {
    let (url, seen) = scripted_peer(vec![answer("500 Internal Server Error", &[], ""), created(false)]).await;
    let clock = Arc::new(ManualClock::default());
    let done = client(&url, RetryPolicy::default(), clock)
        .post("/v1/labels", &key(), b"{}".to_vec())
        .await
        .unwrap();
    assert_eq!((done.status, done.replayed, done.attempts), (201, false, 2));
    assert_eq!(done.text(), r#"{"label_id":"L1"}"#);
    assert_eq!(seen.lock().unwrap().len(), 2);

    let not_found = answer("404 Not Found", &[], r#"{"code":"not_found"}"#);
    let (url, seen) = scripted_peer(vec![not_found]).await;
    let error = client(&url, RetryPolicy::default(), Arc::new(ManualClock::default()))
        .post("/v1/labels", &key(), b"{}".to_vec())
        .await
        .unwrap_err();
    assert!(
        matches!(&error, IntentError::Refused { status: 404, attempts: 1, problem } if problem.code.as_deref() == Some("not_found")),
        "{error:?}"
    );
    assert_eq!(seen.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_shared_budget_stops_the_retries_of_every_intent() {
    let (url, seen) = scripted_peer(vec![answer("503 Service Unavailable", &[("retry-after", "1")], "")]).await;
    let budget = Arc::new(RetryBudget::share_of_intents(0, 3).unwrap());
    let clock = Arc::new(ManualClock::default());
    let policy = RetryPolicy::builder().attempts_max(10).build().unwrap();
    let client = IdemClient::builder(url)
        .policy(policy)
        .budget(budget.clone())
        .clock(clock)
        .build()
        .unwrap();
    let first = client.post("/v1/labels", &key(), b"{}".to_vec()).await.unwrap_err();
    assert_eq!(
        first,
        IntentError::GaveUp {
            reason: GiveUpReason::BudgetExhausted,
            attempts: 4,
            last: "unavailable"
        }
    );
    let other = IntentKey::new("label:918273:2:v1").unwrap();
    let second = client.post("/v1/labels", &other, b"{}".to_vec()).await.unwrap_err();
    assert!(
        matches!(
            second,
            IntentError::GaveUp {
                reason: GiveUpReason::BudgetExhausted,
                attempts: 1,
                ..
            }
        ),
        "the empty budget is shared: {second:?}"
    );
    assert_eq!(seen.lock().unwrap().len(), 5);
    assert!(budget.refused() >= 2);
}

/// A peer that accepts connections and never answers.
async fn silent_peer() -> (String, Arc<Mutex<usize>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let accepted = Arc::new(Mutex::new(0));
    let counting = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((connection, _)) = listener.accept().await {
            *counting.lock().unwrap() += 1;
            held.push(connection);
        }
    });
    (url, accepted)
}

#[tokio::test]
async fn each_attempt_has_a_deadline_and_so_has_the_intent() {
    let (url, accepted) = silent_peer().await;
    let policy = RetryPolicy::builder()
        .attempts_max(100)
        .attempt_timeout(Duration::from_millis(50))
        .intent_timeout(Duration::from_millis(400))
        .backoff(Duration::from_millis(1), Duration::from_millis(10))
        .build()
        .unwrap();
    let client = IdemClient::builder(url).policy(policy).build().unwrap();
    let started = std::time::Instant::now();
    let error = client.post("/v1/labels", &key(), b"{}".to_vec()).await.unwrap_err();
    let IntentError::GaveUp {
        reason: GiveUpReason::DeadlineExceeded,
        attempts,
        last: "timeout",
    } = error
    else {
        panic!("timeouts are retried until the intent's deadline: {error:?}");
    };
    assert!((2..100).contains(&attempts), "{attempts}");
    assert_eq!(
        *accepted.lock().unwrap(),
        attempts as usize,
        "one connection per attempt"
    );
    // A bound, not a measurement: the intent stops near its 400 ms, never
    // after 100 attempts of 50 ms.
    assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
}

#[tokio::test]
async fn a_request_without_a_key_is_sent_once_and_a_bad_key_is_never_sent() {
    let (url, seen) = scripted_peer(vec![answer("503 Service Unavailable", &[], "")]).await;
    let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(idem_client::IdempotentRetries::new(RetryPolicy::default()).on_clock(Arc::new(ManualClock::default())))
        .build();
    let answer = http.post(format!("{url}/v1/labels")).body("{}").send().await.unwrap();
    assert_eq!(answer.status(), 503);
    assert_eq!(seen.lock().unwrap().len(), 1, "no key: not retried");
    let refused = http
        .post(format!("{url}/v1/labels"))
        .header("idempotency-key", "\"unterminated")
        .body("{}")
        .send()
        .await;
    assert!(refused.is_err());
    assert_eq!(seen.lock().unwrap().len(), 1, "a bad key never reaches the wire");
}

/// A span's name and its parent's.
type SpanAndParent = (&'static str, Option<&'static str>);

/// Every span opened, with its parent's name.
#[derive(Clone, Default)]
struct SpanLog(Arc<Mutex<Vec<SpanAndParent>>>);

impl<S> tracing_subscriber::Layer<S> for SpanLog
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    fn on_new_span(
        &self,
        attributes: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        context: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let parent = context
            .span(id)
            .and_then(|span| span.parent())
            .map(|parent| parent.name());
        self.0.lock().unwrap().push((attributes.metadata().name(), parent));
    }
}

#[test]
fn metrics_count_attempts_retries_replays_budget_and_outcomes_and_each_intent_is_a_span_of_attempts() {
    use tracing_subscriber::layer::SubscriberExt;
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let exposition = recorder.handle();
    let spans = SpanLog::default();
    let subscriber = tracing_subscriber::registry().with(spans.clone());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let unavailable = answer("503 Service Unavailable", &[], "");
    metrics::with_local_recorder(&recorder, || {
        tracing::subscriber::with_default(subscriber, || {
            runtime.block_on(async {
                let (url, _) = scripted_peer(vec![unavailable.clone(), created(true), unavailable]).await;
                let budget = Arc::new(RetryBudget::share_of_intents(0, 3).unwrap());
                let client = IdemClient::builder(url)
                    .budget(budget)
                    .clock(Arc::new(ManualClock::default()))
                    .build()
                    .unwrap();
                let done = client.post("/v1/labels", &key(), b"{}".to_vec()).await.unwrap();
                assert!(done.replayed);
                let other = IntentKey::new("label:918273:2:v1").unwrap();
                let error = client.post("/v1/labels", &other, b"{}".to_vec()).await.unwrap_err();
                assert!(
                    matches!(
                        error,
                        IntentError::GaveUp {
                            reason: GiveUpReason::BudgetExhausted,
                            attempts: 3,
                            ..
                        }
                    ),
                    "{error:?}"
                );
            })
        })
    });
    let text = exposition.render();
    for line in [
        r#"idem_client_attempts_total{answer="unavailable"} 4"#,
        r#"idem_client_attempts_total{answer="replayed"} 1"#,
        r#"idem_client_retries_total{after="unavailable"} 3"#,
        "idem_client_budget_exhausted_total 1",
        "idem_client_replays_total 1",
        r#"idem_client_intents_total{outcome="replayed"} 1"#,
        r#"idem_client_intents_total{outcome="budget_exhausted"} 1"#,
    ] {
        assert!(text.lines().any(|exposed| exposed == line), "{line} in:\n{text}");
    }
    let spans = spans.0.lock().unwrap().clone();
    let intents = spans.iter().filter(|(name, _)| *name == "intent").count();
    let attempts: Vec<_> = spans.iter().filter(|(name, _)| *name == "attempt").collect();
    assert_eq!((intents, attempts.len()), (2, 5), "{spans:?}");
    assert!(
        attempts.iter().all(|(_, parent)| *parent == Some("intent")),
        "{spans:?}"
    );
}
