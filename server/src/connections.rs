//! Serving accepted connections with hyper's HTTP/1 connection builder,
//! for the limits `axum::serve` does not set:
//!
//! - a **header-read timeout**: a client must send a whole request head
//!   within `server.header_read_timeout_ms`, or its connection is closed
//!   without an answer (a slowloris client that trickles a header holds
//!   nothing for long). hyper starts the same timer when a keep-alive
//!   connection waits for its next request, so it is also the longest a
//!   connection may sit idle between requests;
//! - a **connection cap**: a connection holds one of `server.connections_max`
//!   slots from accept to close; with every slot taken the server stops
//!   accepting, and new connections wait in the kernel's backlog until one
//!   closes, instead of costing a task and a buffer each;
//! - with `[server.tls]`, a **TLS handshake timeout**: the handshake runs in
//!   the connection's own task, holding its slot, and must finish within
//!   `server.tls.handshake_timeout_ms`, or the connection is closed; then
//!   the header-read timeout applies to the decrypted stream as above. A
//!   client that does not speak TLS fails the handshake and is closed
//!   without an answer.
//!
//! Shutdown is as with `axum::serve`'s graceful shutdown: when `draining`
//! is cancelled the server stops accepting, every connection finishes the
//! request it is serving and closes, and [`serve_connections`] returns once
//! the last one has closed.

use crate::tls::InboundTls;
use axum::Router;
use axum::body::Body;
use hyper::body::Incoming;
use hyper::rt::{Read, Write};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

/// Pause after an accept failed for a reason that is not the connection's
/// own (out of file descriptors, out of memory), so the loop does not spin
/// while the cause lasts.
pub const ACCEPT_ERROR_PAUSE_MS: u64 = 100;

/// The per-connection limits, from `[server]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Longest wait for a whole request head, and longest idle keep-alive.
    pub header_read_timeout: Duration,
    /// Connections open at once.
    pub connections_max: usize,
}

/// Accepts and serves connections on `listener` until `draining` is
/// cancelled, then waits for the open connections to finish and close.
///
/// With `tls`, each connection is served only after its TLS handshake
/// finished within the handshake timeout.
pub async fn serve_connections(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    tls: Option<InboundTls>,
    draining: CancellationToken,
) {
    let connections = TaskTracker::new();
    let slots = Arc::new(Semaphore::new(limits.connections_max));
    while let Some((stream, slot)) = next_connection(&listener, &slots, &draining).await {
        let router = router.clone();
        let draining = draining.clone();
        let tls = tls.clone();
        connections.spawn(async move {
            match tls {
                None => serve_connection(TokioIo::new(stream), router, limits.header_read_timeout, draining).await,
                Some(tls) => {
                    if let Some(stream) = handshake(stream, &tls, &draining).await {
                        serve_connection(TokioIo::new(stream), router, limits.header_read_timeout, draining).await;
                    }
                }
            }
            drop(slot);
        });
    }
    connections.close();
    connections.wait().await;
}

/// The next accepted connection and the slot it holds; `None` once
/// draining. A slot is taken before accepting, so at the cap the server
/// leaves new connections in the backlog.
async fn next_connection(
    listener: &TcpListener,
    slots: &Arc<Semaphore>,
    draining: &CancellationToken,
) -> Option<(TcpStream, OwnedSemaphorePermit)> {
    let slot = tokio::select! {
        biased;
        () = draining.cancelled() => return None,
        slot = slots.clone().acquire_owned() => slot.ok()?,
    };
    loop {
        let accepted = tokio::select! {
            biased;
            () = draining.cancelled() => return None,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, _peer)) => return Some((stream, slot)),
            Err(error) if is_connection_error(&error) => {
                tracing::debug!(%error, "a connection failed before it was accepted");
            }
            Err(error) => {
                tracing::warn!(%error, "accept failed; pausing {ACCEPT_ERROR_PAUSE_MS} ms");
                tokio::time::sleep(Duration::from_millis(ACCEPT_ERROR_PAUSE_MS)).await;
            }
        }
    }
}

/// Errors that concern one connection only (it was reset before we took it).
fn is_connection_error(error: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(error.kind(), ConnectionRefused | ConnectionAborted | ConnectionReset)
}

/// The TLS stream once the handshake finished within its timeout; `None`
/// when it failed (a client that does not speak TLS, or trusts another
/// CA), timed out (a slowloris handshake), or draining began meanwhile.
async fn handshake(
    stream: TcpStream,
    tls: &InboundTls,
    draining: &CancellationToken,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    let accepted = tokio::select! {
        () = draining.cancelled() => return None,
        accepted = tokio::time::timeout(tls.handshake_timeout, tls.acceptor.accept(stream)) => accepted,
    };
    match accepted {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(error)) => {
            // The client's business (a plain HTTP client, a CA it does not
            // trust): logged for debugging only, like a client that hung up.
            tracing::debug!(%error, "TLS handshake failed");
            None
        }
        Err(_elapsed) => {
            tracing::debug!(timeout = ?tls.handshake_timeout, "TLS handshake timed out");
            None
        }
    }
}

/// Serves one connection's requests until it closes, is cut by the
/// header-read timeout, or finishes its request in flight after draining began.
async fn serve_connection<S: Read + Write + Unpin + Send + 'static>(
    stream: S,
    router: Router,
    header_read_timeout: Duration,
    draining: CancellationToken,
) {
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        router.clone().oneshot(request.map(Body::new))
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    let connection = builder.serve_connection(stream, service);
    tokio::pin!(connection);
    let served = tokio::select! {
        served = connection.as_mut() => served,
        () = draining.cancelled() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(error) = served {
        // A client that hung up or was too slow: its business, not an
        // error of the server's. Logged for debugging only.
        tracing::debug!(%error, "connection closed with an error");
    }
}
