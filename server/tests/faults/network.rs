//! The campaign's network: a bridge in the root namespace holding the
//! stores' and the carrier's addresses, and one network namespace per
//! instance, joined to the bridge by a veth pair, with an address that
//! exists only inside it. Partitions are routes: a blackhole route in an
//! instance's namespace to the stores' address (or the carrier's) cuts it
//! off from that peer alone, open connections included, and deleting the
//! route heals it.
//!
//! Everything is created by [`Network::create`] and removed on drop, a
//! failed test included. A run killed outright (SIGKILL) cannot run its
//! drop: the next run removes what a dead process left behind, as every
//! name carries the process id that made it.

use std::net::Ipv4Addr;
use std::process::Command;

/// Names of namespaces, bridges and veth ends start with this.
const NAME_PREFIX: &str = "idf";
/// The campaign's subnets are `10.231.X.0/24`, X chosen per run.
const SUBNET_FIRST_OCTETS: [u8; 2] = [10, 231];
/// Lowest and highest third octet tried.
const SUBNET_THIRD_MIN: u8 = 20;
const SUBNET_THIRD_MAX: u8 = 239;
/// Host part of the stores' address (the bridge's first address).
const STORE_HOST: u8 = 1;
/// Host part of the carrier's address (the bridge's second address).
const CARRIER_HOST: u8 = 2;
/// Host part of instance 0's address; instance i has this plus i.
const INSTANCE_HOST_FIRST: u8 = 10;

/// Which peer a partition cuts an instance off from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    Store,
    Carrier,
}

/// A bridge and one namespace per instance, removed on drop.
#[derive(Debug)]
pub struct Network {
    tag: String,
    subnet: [u8; 3],
    instances: usize,
}

impl Network {
    /// Builds the bridge and `instances` namespaces; panics, having removed
    /// what it made, when the kernel refuses (the campaign needs root).
    pub fn create(instances: usize) -> Self {
        remove_what_dead_runs_left();
        let tag = format!("{NAME_PREFIX}{}", std::process::id());
        let network = Self {
            subnet: free_subnet(),
            tag,
            instances,
        };
        network.build();
        network
    }

    fn bridge(&self) -> String {
        format!("{}b", self.tag)
    }

    /// The namespace of instance `index`.
    pub fn namespace(&self, index: usize) -> String {
        format!("{}n{index}", self.tag)
    }

    fn address(&self, host: u8) -> Ipv4Addr {
        let [a, b, c] = self.subnet;
        Ipv4Addr::new(a, b, c, host)
    }

    /// Where the stores (and their proxies) listen, in the root namespace.
    pub fn store_address(&self) -> Ipv4Addr {
        self.address(STORE_HOST)
    }

    /// Where the carrier's proxy listens, in the root namespace.
    pub fn carrier_address(&self) -> Ipv4Addr {
        self.address(CARRIER_HOST)
    }

    /// Instance `index`'s address, inside its namespace.
    pub fn instance_address(&self, index: usize) -> Ipv4Addr {
        self.address(INSTANCE_HOST_FIRST + u8::try_from(index).expect("a few instances"))
    }

    fn peer_address(&self, peer: Peer) -> Ipv4Addr {
        match peer {
            Peer::Store => self.store_address(),
            Peer::Carrier => self.carrier_address(),
        }
    }

    fn build(&self) {
        let bridge = self.bridge();
        ip(&["link", "add", &bridge, "type", "bridge"]);
        for host in [STORE_HOST, CARRIER_HOST] {
            ip(&["addr", "add", &format!("{}/24", self.address(host)), "dev", &bridge]);
        }
        ip(&["link", "set", &bridge, "up"]);
        for index in 0..self.instances {
            let (namespace, host_end, inner_end) = (
                self.namespace(index),
                format!("{}h{index}", self.tag),
                format!("{}p{index}", self.tag),
            );
            ip(&["netns", "add", &namespace]);
            ip(&["link", "add", &host_end, "type", "veth", "peer", "name", &inner_end]);
            ip(&["link", "set", &inner_end, "netns", &namespace]);
            ip(&["link", "set", &host_end, "master", &bridge]);
            ip(&["link", "set", &host_end, "up"]);
            let address = format!("{}/24", self.instance_address(index));
            ip(&["-n", &namespace, "addr", "add", &address, "dev", &inner_end]);
            ip(&["-n", &namespace, "link", "set", &inner_end, "up"]);
            ip(&["-n", &namespace, "link", "set", "lo", "up"]);
        }
    }

    /// Cuts instance `index` off from `peer`: its packets there are dropped.
    pub fn cut(&self, index: usize, peer: Peer) {
        let route = format!("{}/32", self.peer_address(peer));
        ip(&["-n", &self.namespace(index), "route", "add", "blackhole", &route]);
    }

    /// Undoes [`Network::cut`].
    pub fn heal(&self, index: usize, peer: Peer) {
        let route = format!("{}/32", self.peer_address(peer));
        ip(&["-n", &self.namespace(index), "route", "del", "blackhole", &route]);
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        remove_tagged(&self.tag);
    }
}

/// Runs `ip ARGS` and panics with its output when it fails.
fn ip(args: &[&str]) {
    let output = Command::new("ip").args(args).output().expect("run ip (iproute2)");
    assert!(
        output.status.success(),
        "ip {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `ip ARGS`, its output, whether or not it succeeded.
fn ip_output(args: &[&str]) -> String {
    Command::new("ip")
        .args(args)
        .output()
        .map(|output| String::from_utf8_lossy(&output.stdout).into_owned())
        .unwrap_or_default()
}

/// The first `10.231.X` no interface of this machine uses yet, starting
/// from one derived from the process id, so parallel runs differ.
fn free_subnet() -> [u8; 3] {
    let used = ip_output(&["-o", "-4", "addr", "show"]);
    let span = u32::from(SUBNET_THIRD_MAX - SUBNET_THIRD_MIN) + 1;
    let start = std::process::id() % span;
    (0..span)
        .map(|step| SUBNET_THIRD_MIN + u8::try_from((start + step) % span).expect("below 256"))
        .map(|third| [SUBNET_FIRST_OCTETS[0], SUBNET_FIRST_OCTETS[1], third])
        .find(|[a, b, c]| !used.contains(&format!(" {a}.{b}.{c}.")))
        .expect("a free 10.231.X.0/24 subnet")
}

/// Removes the bridge and namespaces whose names carry `tag`; the veth
/// pairs go with them.
fn remove_tagged(tag: &str) {
    for namespace in ip_output(&["netns", "list"]).lines() {
        let name = namespace.split_whitespace().next().unwrap_or_default();
        if name.strip_prefix(tag).is_some_and(|rest| rest.starts_with('n')) {
            let _ = Command::new("ip").args(["netns", "del", name]).output();
        }
    }
    for link in ip_output(&["-o", "link", "show"]).lines() {
        let Some(name) = link
            .split(": ")
            .nth(1)
            .map(|name| name.split('@').next().unwrap_or(name))
        else {
            continue;
        };
        if name.strip_prefix(tag).is_some_and(|rest| rest.starts_with(['b', 'h'])) {
            // The veth ends went with their namespaces: only the bridge is left.
            let _ = Command::new("ip").args(["link", "del", name]).output();
        }
    }
}

/// What runs killed before their drop left: every tag whose process is gone.
fn remove_what_dead_runs_left() {
    let names = ip_output(&["netns", "list"]) + &ip_output(&["-o", "link", "show"]);
    let mut dead = std::collections::BTreeSet::new();
    for word in names.split(|c: char| c.is_whitespace() || c == ':' || c == '@') {
        let Some(rest) = word.strip_prefix(NAME_PREFIX) else {
            continue;
        };
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let Ok(pid) = digits.parse::<u32>() else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            dead.insert(format!("{NAME_PREFIX}{pid}"));
        }
    }
    for tag in dead {
        eprintln!("FAULTS removing the network a dead run left: {tag}*");
        remove_tagged(&tag);
    }
}
