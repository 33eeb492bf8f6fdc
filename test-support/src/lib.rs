//! What idem's test harnesses and the bench share: free loopback ports,
//! child processes that end with their parent ([`child`]), (feature `tls`) test certificates ([`tls::TestCertificates`]), and
//! (feature `harness`) server binaries as child processes ([`process`]),
//! an HTTP client and its replies ([`http`]), and the test callers and
//! label bodies ([`callers`]), and (feature `fault-proxy`) a TCP relay
//! that delays, drops, resets or blackholes on command ([`fault_proxy`]).
//!
//! A server a test starts (redis-server, PostgreSQL, fdbserver, the Label
//! service as a child process) is told its port before it binds it. The
//! port must be free then and stay free until the server binds it, so it is
//! chosen below the kernel's ephemeral range (`net.ipv4.ip_local_port_range`,
//! 32768 to 60999 by default), from which the kernel hands out the local
//! ports of outgoing connections: a port chosen there can be taken by any
//! connection the machine opens in between.

use std::net::TcpListener;

#[cfg(feature = "harness")]
pub mod callers;
pub mod child;
#[cfg(feature = "fault-proxy")]
pub mod fault_proxy;
#[cfg(feature = "harness")]
pub mod http;
#[cfg(feature = "harness")]
pub mod process;
#[cfg(feature = "tls")]
pub mod tls;

/// Lowest port handed out: above the well-known and most registered
/// services' ports.
pub const TEST_PORT_MIN: u16 = 20_000;
/// Highest port handed out: just below the kernel's ephemeral range.
pub const TEST_PORT_MAX: u16 = 32_767;
/// Random ports tried before giving up.
pub const FREE_PORT_ATTEMPTS: u32 = 200;

/// A loopback port in `TEST_PORT_MIN..=TEST_PORT_MAX` that nothing listens
/// on right now. A caller that loses a race for it anyway (another test
/// took it) should try a fresh one, as the harnesses do.
pub fn free_loopback_port() -> std::io::Result<u16> {
    for _ in 0..FREE_PORT_ATTEMPTS {
        let port = rand::random_range(TEST_PORT_MIN..=TEST_PORT_MAX);
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrInUse,
        format!("no free loopback port in {TEST_PORT_MIN}..={TEST_PORT_MAX} after {FREE_PORT_ATTEMPTS} tries"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_free_and_below_the_ephemeral_range() {
        for _ in 0..50 {
            let port = free_loopback_port().expect("a free port");
            assert!((TEST_PORT_MIN..=TEST_PORT_MAX).contains(&port), "{port}");
            let listener = TcpListener::bind(("127.0.0.1", port)).expect("the port is free");
            drop(listener);
        }
    }
}
