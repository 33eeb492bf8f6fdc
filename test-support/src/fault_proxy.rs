//! A TCP relay that misbehaves on command, for fault campaigns: put it
//! between a client and a server (an instance and its store or its
//! carrier) and tell it what the network does now.
//!
//! | [`Fault`] | new connections | connections already open |
//! |---|---|---|
//! | `Pass` | relayed | relayed |
//! | `Delay(d)` | relayed, each chunk held back `d` | the same |
//! | `DropReplies` | the request reaches the server, the answer is thrown away | the same |
//! | `Blackhole` | accepted, then silence both ways, for good | silence both ways from now on, for good |
//! | `Reset` | refused with a TCP reset | reset at once |
//!
//! A blackholed connection never comes back, even after `Pass`: a peer that
//! went silent is what a client's timeouts are for, and a relay that woke
//! old connections up would hide that. Every change applies to the
//! connections already open at once (each relay direction watches the
//! setting while it waits for bytes), so `Reset` does not wait for traffic.
//!
//! The relay runs on the caller's tokio runtime and ends, closing every
//! connection it holds, when the [`FaultProxy`] is dropped.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Bytes one relay read takes at most.
pub const RELAY_CHUNK_BYTES_MAX: usize = 16 * 1024;
/// Longest a relay waits to connect to the server before giving the
/// client's connection up.
pub const UPSTREAM_CONNECT_MS_MAX: u64 = 5_000;

/// What the relay does to traffic, from now on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Pass,
    /// Every chunk, both ways, waits this long before it is passed on.
    Delay(Duration),
    /// Client to server passes; server to client is discarded: the server
    /// did the work, the client never hears of it.
    DropReplies,
    /// Nothing passes either way and nothing is closed.
    Blackhole,
    /// Connections are reset (RST), new ones as soon as they arrive.
    Reset,
}

/// Counts of what the relay has done, for a campaign's log.
#[derive(Debug, Default)]
pub struct ProxyCounters {
    pub connections_accepted: AtomicU64,
    pub connections_reset: AtomicU64,
    pub chunks_relayed: AtomicU64,
    pub chunks_dropped: AtomicU64,
}

/// A running relay from [`FaultProxy::local_addr`] to its upstream.
pub struct FaultProxy {
    local_addr: SocketAddr,
    upstream: SocketAddr,
    fault: watch::Sender<Setting>,
    counters: Arc<ProxyCounters>,
    acceptor: JoinHandle<()>,
}

/// The setting every relay task watches; `Closed` when the proxy is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Setting {
    Active(Fault),
    Closed,
}

impl FaultProxy {
    /// Listens on `listen` (port 0 for any) and relays to `upstream`,
    /// passing traffic until told otherwise.
    pub async fn start(listen: SocketAddr, upstream: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind(listen).await?;
        let local_addr = listener.local_addr()?;
        let (fault, setting) = watch::channel(Setting::Active(Fault::Pass));
        let counters = Arc::new(ProxyCounters::default());
        let acceptor = tokio::spawn(accept_each(listener, upstream, setting, counters.clone()));
        Ok(Self {
            local_addr,
            upstream,
            fault,
            counters,
            acceptor,
        })
    }

    /// Where clients connect.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Where the relay connects.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// Changes what the relay does, for open and new connections alike.
    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(Setting::Active(fault));
    }

    /// What the relay does now.
    pub fn fault(&self) -> Fault {
        match *self.fault.borrow() {
            Setting::Active(fault) => fault,
            Setting::Closed => Fault::Reset,
        }
    }

    pub fn counters(&self) -> &ProxyCounters {
        &self.counters
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.fault.send_replace(Setting::Closed);
        self.acceptor.abort();
    }
}

async fn accept_each(
    listener: TcpListener,
    upstream: SocketAddr,
    setting: watch::Receiver<Setting>,
    counters: Arc<ProxyCounters>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            // Out of descriptors or a connection aborted before accept:
            // the next one may do better.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        counters.connections_accepted.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(relay_one(client, upstream, setting.clone(), counters.clone()));
    }
}

/// One client connection, from accept to close.
async fn relay_one(
    client: TcpStream,
    upstream: SocketAddr,
    setting: watch::Receiver<Setting>,
    counters: Arc<ProxyCounters>,
) {
    let current = *setting.borrow();
    match current {
        Setting::Closed => return,
        Setting::Active(Fault::Reset) => {
            reset(&client, &counters);
            return;
        }
        Setting::Active(Fault::Blackhole) => {
            swallow(client, setting).await;
            return;
        }
        Setting::Active(_) => {}
    }
    let connect = tokio::time::timeout(
        Duration::from_millis(UPSTREAM_CONNECT_MS_MAX),
        TcpStream::connect(upstream),
    );
    let Ok(Ok(server)) = connect.await else {
        // As a real server that is not there: the client's connection ends.
        reset(&client, &counters);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    relay_both_ways(client, server, setting, &counters).await;
}

/// Which way a chunk goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    ToServer,
    ToClient,
}

/// Copies both directions in one loop, doing to each chunk what the
/// setting says, until either side closes or the setting resets it. One
/// loop (not a task per direction) so that a reset closes both sockets
/// whole, with an RST, rather than half of each with a FIN.
async fn relay_both_ways(
    mut client: TcpStream,
    mut server: TcpStream,
    mut setting: watch::Receiver<Setting>,
    counters: &ProxyCounters,
) {
    let mut from_client = vec![0u8; RELAY_CHUNK_BYTES_MAX];
    let mut from_server = vec![0u8; RELAY_CHUNK_BYTES_MAX];
    let mut silent = false;
    loop {
        let (direction, read) = tokio::select! {
            read = client.read(&mut from_client) => (Direction::ToServer, read),
            read = server.read(&mut from_server) => (Direction::ToClient, read),
            changed = setting.changed() => {
                if changed.is_err() {
                    return;
                }
                match *setting.borrow_and_update() {
                    Setting::Closed => return,
                    Setting::Active(Fault::Reset) => {
                        reset(&client, counters);
                        reset(&server, counters);
                        return;
                    }
                    Setting::Active(Fault::Blackhole) => silent = true,
                    Setting::Active(_) => {}
                }
                continue;
            }
        };
        let bytes = match read {
            Ok(0) | Err(_) => return,
            Ok(bytes) => bytes,
        };
        let fault = match *setting.borrow() {
            Setting::Closed => return,
            Setting::Active(fault) => fault,
        };
        if fault == Fault::Reset {
            reset(&client, counters);
            reset(&server, counters);
            return;
        }
        silent |= fault == Fault::Blackhole;
        if silent || (fault == Fault::DropReplies && direction == Direction::ToClient) {
            counters.chunks_dropped.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        if let Fault::Delay(delay) = fault {
            tokio::time::sleep(delay).await;
        }
        let written = match direction {
            Direction::ToServer => server.write_all(&from_client[..bytes]).await,
            Direction::ToClient => client.write_all(&from_server[..bytes]).await,
        };
        if written.is_err() {
            return;
        }
        counters.chunks_relayed.fetch_add(1, Ordering::Relaxed);
    }
}

/// Holds a connection open and discards what it sends, until the proxy is
/// dropped or the client gives up.
async fn swallow(mut client: TcpStream, mut setting: watch::Receiver<Setting>) {
    let mut buffer = vec![0u8; RELAY_CHUNK_BYTES_MAX];
    loop {
        tokio::select! {
            read = client.read(&mut buffer) => if matches!(read, Ok(0) | Err(_)) { return },
            changed = setting.changed() => {
                if changed.is_err() || *setting.borrow_and_update() == Setting::Closed {
                    return;
                }
            }
        }
    }
}

/// Closes with a reset (SO_LINGER 0) instead of an orderly FIN.
fn reset(stream: &TcpStream, counters: &ProxyCounters) {
    let _ = stream.set_zero_linger();
    counters.connections_reset.fetch_add(1, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// Answers every chunk it reads with the same bytes, and counts what it read.
    async fn echo_server() -> (SocketAddr, Arc<AtomicU64>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let received = Arc::new(AtomicU64::new(0));
        let counted = received.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let counted = counted.clone();
                tokio::spawn(async move {
                    let mut buffer = [0u8; 1024];
                    while let Ok(bytes @ 1..) = stream.read(&mut buffer).await {
                        counted.fetch_add(bytes as u64, Ordering::Relaxed);
                        if stream.write_all(&buffer[..bytes]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (address, received)
    }

    async fn proxy_to_echo() -> (FaultProxy, Arc<AtomicU64>) {
        let (upstream, received) = echo_server().await;
        let proxy = FaultProxy::start("127.0.0.1:0".parse().unwrap(), upstream)
            .await
            .unwrap();
        (proxy, received)
    }

    /// Sends `ping` and waits at most `wait` for the 4 bytes back.
    async fn round_trip(stream: &mut TcpStream, wait: Duration) -> io::Result<Option<[u8; 4]>> {
        stream.write_all(b"ping").await?;
        let mut answer = [0u8; 4];
        match tokio::time::timeout(wait, stream.read_exact(&mut answer)).await {
            Ok(read) => read.map(|_| Some(answer)),
            Err(_) => Ok(None),
        }
    }

    const ANSWER_WAIT: Duration = Duration::from_secs(5);
    const SILENCE_WAIT: Duration = Duration::from_millis(300);

    #[tokio::test]
    async fn passes_traffic_both_ways() {
        let (proxy, received) = proxy_to_echo().await;
        let mut stream = TcpStream::connect(proxy.local_addr()).await.unwrap();
        assert_eq!(round_trip(&mut stream, ANSWER_WAIT).await.unwrap(), Some(*b"ping"));
        assert_eq!(received.load(Ordering::Relaxed), 4);
        assert_eq!(proxy.fault(), Fault::Pass);
    }

    #[tokio::test]
    async fn a_delay_holds_each_chunk_back_at_least_that_long() {
        let (proxy, _) = proxy_to_echo().await;
        let mut stream = TcpStream::connect(proxy.local_addr()).await.unwrap();
        proxy.set(Fault::Delay(Duration::from_millis(150)));
        let started = Instant::now();
        assert_eq!(round_trip(&mut stream, ANSWER_WAIT).await.unwrap(), Some(*b"ping"));
        // Both ways: at least two delays.
        assert!(
            started.elapsed() >= Duration::from_millis(300),
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn dropped_replies_reach_the_server_and_never_come_back() {
        let (proxy, received) = proxy_to_echo().await;
        proxy.set(Fault::DropReplies);
        let mut stream = TcpStream::connect(proxy.local_addr()).await.unwrap();
        assert_eq!(round_trip(&mut stream, SILENCE_WAIT).await.unwrap(), None);
        assert_eq!(received.load(Ordering::Relaxed), 4, "the server got the request");
        assert!(proxy.counters().chunks_dropped.load(Ordering::Relaxed) >= 1);
    }

    #[tokio::test]
    async fn a_blackhole_silences_open_connections_for_good() {
        let (proxy, received) = proxy_to_echo().await;
        let mut stream = TcpStream::connect(proxy.local_addr()).await.unwrap();
        assert_eq!(round_trip(&mut stream, ANSWER_WAIT).await.unwrap(), Some(*b"ping"));
        proxy.set(Fault::Blackhole);
        assert_eq!(round_trip(&mut stream, SILENCE_WAIT).await.unwrap(), None);
        let mut fresh = TcpStream::connect(proxy.local_addr()).await.unwrap();
        assert_eq!(round_trip(&mut fresh, SILENCE_WAIT).await.unwrap(), None);
        assert_eq!(
            received.load(Ordering::Relaxed),
            4,
            "nothing reached the server after the first ping"
        );
        // Healed: new connections pass, the silenced ones stay silent.
        proxy.set(Fault::Pass);
        assert_eq!(round_trip(&mut stream, SILENCE_WAIT).await.unwrap(), None);
        let mut after = TcpStream::connect(proxy.local_addr()).await.unwrap();
        assert_eq!(round_trip(&mut after, ANSWER_WAIT).await.unwrap(), Some(*b"ping"));
    }

    #[tokio::test]
    async fn a_reset_breaks_open_connections_at_once_and_refuses_new_ones() {
        let (proxy, _) = proxy_to_echo().await;
        let mut stream = TcpStream::connect(proxy.local_addr()).await.unwrap();
        assert_eq!(round_trip(&mut stream, ANSWER_WAIT).await.unwrap(), Some(*b"ping"));
        proxy.set(Fault::Reset);
        // No traffic needed: the open connection is reset while idle.
        let mut buffer = [0u8; 4];
        let read = tokio::time::timeout(ANSWER_WAIT, stream.read(&mut buffer))
            .await
            .expect("the reset arrives");
        assert!(
            matches!(&read, Err(error) if error.kind() == io::ErrorKind::ConnectionReset),
            "{read:?}"
        );
        let mut fresh = TcpStream::connect(proxy.local_addr()).await.unwrap();
        let outcome = round_trip(&mut fresh, ANSWER_WAIT).await;
        assert!(outcome.is_err(), "a new connection was served: {outcome:?}");
        assert!(proxy.counters().connections_reset.load(Ordering::Relaxed) >= 2);
    }

    #[tokio::test]
    async fn a_dropped_proxy_closes_its_connections() {
        let (proxy, _) = proxy_to_echo().await;
        let mut stream = TcpStream::connect(proxy.local_addr()).await.unwrap();
        assert_eq!(round_trip(&mut stream, ANSWER_WAIT).await.unwrap(), Some(*b"ping"));
        let address = proxy.local_addr();
        drop(proxy);
        let mut buffer = [0u8; 4];
        let read = tokio::time::timeout(ANSWER_WAIT, stream.read(&mut buffer))
            .await
            .expect("the close arrives");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(TcpStream::connect(address).await.is_err(), "the listener is closed");
    }
}
