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
//! - a **per-peer cap**: one peer address (an IPv6 peer by its /64, the
//!   block one host is usually given) holds at most
//!   `server.connections_per_peer_max` connections; one more is closed as
//!   soon as it is accepted. Without it one client, opening connections
//!   and sending nothing for the header-read timeout, takes every slot of
//!   the cap above from everyone else, as nginx's `limit_conn` per address
//!   and HAProxy's `conn_cur` tracking guard against. Behind a load
//!   balancer or proxy every client shares its few addresses: raise the
//!   cap to `connections_max` there, and let the proxy cap its clients;
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

use crate::metrics::{CONNECTIONS_OPEN, CONNECTIONS_PEER_CAP_REFUSED_TOTAL};
use crate::tls::InboundTls;
use axum::Router;
use axum::body::Body;
use hyper::body::Incoming;
use hyper::rt::{Read, Write};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex, PoisonError};
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
    /// Connections open at once from one peer address (an IPv6 /64).
    pub connections_per_peer_max: usize,
}

/// The connections each peer address holds now; an entry lives while its
/// peer holds one, so the map is never larger than the connection cap.
#[derive(Default)]
struct Peers {
    held: Mutex<HashMap<IpAddr, usize>>,
}

/// One connection's place under its peer's cap, given back on drop.
struct PeerSlot {
    peers: Arc<Peers>,
    peer: IpAddr,
}

impl Peers {
    /// A place for one more connection of `peer`, unless it holds `max`.
    fn take(self: &Arc<Self>, peer: IpAddr, max: usize) -> Option<PeerSlot> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let count = held.entry(peer).or_insert(0);
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(PeerSlot {
            peers: self.clone(),
            peer,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut held = self.peers.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = held.get_mut(&self.peer) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.peer);
            }
        }
    }
}

/// The address a peer is capped by: an IPv4 address as it is, an IPv6 one
/// by its /64 (a host is usually given a whole /64, and can pick any
/// address in it).
fn peer_of(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(v6.to_bits() & !u128::from(u64::MAX))),
        },
        v4 => v4,
    }
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
    let peers = Arc::new(Peers::default());
    while let Some((stream, peer, slot)) = next_connection(&listener, &slots, &draining).await {
        let Some(peer_slot) = peers.take(peer_of(peer), limits.connections_per_peer_max) else {
            // Closed unread: the peer holds its share of the cap already.
            metrics::counter!(CONNECTIONS_PEER_CAP_REFUSED_TOTAL).increment(1);
            drop((stream, slot));
            continue;
        };
        let router = router.clone();
        let draining = draining.clone();
        let tls = tls.clone();
        connections.spawn(async move {
            let open = metrics::gauge!(CONNECTIONS_OPEN);
            open.increment(1.0);
            match tls {
                None => serve_connection(TokioIo::new(stream), router, limits.header_read_timeout, draining).await,
                Some(tls) => {
                    if let Some(stream) = handshake(stream, &tls, &draining).await {
                        serve_connection(TokioIo::new(stream), router, limits.header_read_timeout, draining).await;
                    }
                }
            }
            open.decrement(1.0);
            drop((peer_slot, slot));
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
) -> Option<(TcpStream, IpAddr, OwnedSemaphorePermit)> {
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
            Ok((stream, peer)) => return Some((stream, peer.ip(), slot)),
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
