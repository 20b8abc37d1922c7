//! Where a fault run's nodes live, and how their links are cut.
//!
//! - **Namespaces** (root, `ip` and `iptables` present): one network namespace per node, joined
//!   by veth pairs to a bridge in the host namespace, addresses `10.213.S.(10 + id)/24`. A
//!   partition is a set of directed links; each node's namespace gets `iptables` DROP rules for
//!   the peers it must not hear from or talk to, written at once with `iptables-restore`. The
//!   client processes and the nemesis stay in the host namespace (on the bridge), so clients
//!   reach every node, as in Jepsen: the cut is between nodes.
//! - **Loopback** (anything else): every node on 127.0.0.1; partitions go through each node's
//!   fault control, which drops its traffic to the cut peers (Raft messages and forwarding).
//!
//! Namespaces, veths and the bridge are removed on drop; leftovers of a killed run are removed by
//! the next run (each run leaves its pid in a marker file). Nothing listens outside loopback and
//! the namespaces the run created.
//!
//! Must not depend on: the lease service (this module only moves packets).

use std::collections::BTreeSet;
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use super::HarnessError;

/// Which kind of network a run asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkRequest {
    /// Namespaces when possible, else loopback (the run says which and why).
    Auto,
    /// Namespaces or fail.
    Namespaces,
    /// Loopback and the fault layer, even as root.
    Loopback,
}

/// The network a run got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkMode {
    /// One namespace per node, iptables partitions.
    Namespaces,
    /// Loopback, partitions through the nodes' fault layer.
    Loopback,
}

impl NetworkMode {
    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            NetworkMode::Namespaces => "namespaces+iptables",
            NetworkMode::Loopback => "loopback+fault-layer",
        }
    }
}

/// Where marker files of live runs are kept.
const MARKER_DIR: &str = "/run/tenure-nemesis";
/// First two octets of the runs' subnets.
const SUBNET_PREFIX: [u8; 2] = [10, 213];
/// QUIC and HTTP ports of every node inside its namespace.
const NS_QUIC_PORT: u16 = 7401;
const NS_HTTP_PORT: u16 = 7501;

static RUNS_IN_PROCESS: AtomicU32 = AtomicU32::new(0);

/// A run's network (see the module docs).
#[derive(Debug)]
pub struct Network {
    mode: NetworkMode,
    /// Why namespaces were not used, when they were not.
    pub fallback_reason: Option<String>,
    tag: String,
    subnet: u8,
    node_ids: Vec<u64>,
    loopback_addrs: Vec<(SocketAddr, SocketAddr)>,
    marker: Option<PathBuf>,
}

fn run_quiet(program: &str, args: &[&str]) -> Result<(), String> {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|error| format!("{program}: {error}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

fn command_exists(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// Free ports on 127.0.0.1: one UDP and one TCP per node, held until all are chosen.
fn free_loopback_ports(count: usize) -> Result<Vec<(SocketAddr, SocketAddr)>, HarnessError> {
    let mut held = Vec::new();
    let mut ports = Vec::new();
    for _ in 0..count {
        let udp = std::net::UdpSocket::bind("127.0.0.1:0")
            .map_err(|e| HarnessError::io("binding a UDP port", e))?;
        let tcp = std::net::TcpListener::bind("127.0.0.1:0")
            .map_err(|e| HarnessError::io("binding a TCP port", e))?;
        let pair = (
            udp.local_addr()
                .map_err(|e| HarnessError::io("reading a UDP port", e))?,
            tcp.local_addr()
                .map_err(|e| HarnessError::io("reading a TCP port", e))?,
        );
        ports.push(pair);
        held.push((udp, tcp));
    }
    Ok(ports)
}

impl Network {
    /// Sets up the network for nodes `node_ids`.
    pub fn setup(request: NetworkRequest, node_ids: &[u64]) -> Result<Network, HarnessError> {
        let loopback = |reason: Option<String>| -> Result<Network, HarnessError> {
            Ok(Network {
                mode: NetworkMode::Loopback,
                fallback_reason: reason,
                tag: String::new(),
                subnet: 0,
                node_ids: node_ids.to_vec(),
                loopback_addrs: free_loopback_ports(node_ids.len())?,
                marker: None,
            })
        };
        if request == NetworkRequest::Loopback {
            return loopback(Some("loopback was asked for".into()));
        }
        match Self::setup_namespaces(node_ids) {
            Ok(network) => Ok(network),
            Err(reason) if request == NetworkRequest::Auto => loopback(Some(reason)),
            Err(reason) => Err(HarnessError::Network(reason)),
        }
    }

    fn setup_namespaces(node_ids: &[u64]) -> Result<Network, String> {
        if !rustix::process::geteuid().is_root() {
            return Err("not running as root".into());
        }
        for program in ["ip", "iptables-restore"] {
            if !command_exists(program) {
                return Err(format!("{program} is not installed"));
            }
        }
        remove_stale_runs();
        let pid = std::process::id();
        let sequence = RUNS_IN_PROCESS.fetch_add(1, Ordering::Relaxed);
        let tag = format!(
            "{:05x}",
            (pid.wrapping_mul(31).wrapping_add(sequence)) & 0xf_ffff
        );
        let subnet = free_subnet(pid.wrapping_add(sequence))?;
        std::fs::create_dir_all(MARKER_DIR).map_err(|e| format!("{MARKER_DIR}: {e}"))?;
        let marker = Path::new(MARKER_DIR).join(&tag);
        std::fs::write(&marker, format!("{pid} {subnet}\n"))
            .map_err(|e| format!("{}: {e}", marker.display()))?;
        let mut network = Network {
            mode: NetworkMode::Namespaces,
            fallback_reason: None,
            tag,
            subnet,
            node_ids: node_ids.to_vec(),
            loopback_addrs: Vec::new(),
            marker: Some(marker),
        };
        // On failure the partly built network is torn down by its drop.
        network.build()?;
        Ok(network)
    }

    fn bridge(&self) -> String {
        format!("tn{}br", self.tag)
    }

    fn namespace(&self, id: u64) -> String {
        format!("tnem-{}-n{id}", self.tag)
    }

    fn host_veth(&self, id: u64) -> String {
        format!("tn{}h{id}", self.tag)
    }

    fn ip_of(&self, id: u64) -> Ipv4Addr {
        let host = u8::try_from(10 + id).unwrap_or(u8::MAX);
        Ipv4Addr::new(SUBNET_PREFIX[0], SUBNET_PREFIX[1], self.subnet, host)
    }

    fn build(&mut self) -> Result<(), String> {
        let bridge = self.bridge();
        let host_ip = format!(
            "{}.{}.{}.1/24",
            SUBNET_PREFIX[0], SUBNET_PREFIX[1], self.subnet
        );
        run_quiet("ip", &["link", "add", &bridge, "type", "bridge"])?;
        run_quiet("ip", &["addr", "add", &host_ip, "dev", &bridge])?;
        run_quiet("ip", &["link", "set", &bridge, "up"])?;
        // A host whose FORWARD policy drops (Docker sets one) would drop bridged traffic when
        // br_netfilter is loaded: let this bridge's own traffic through.
        let _ = run_quiet(
            "iptables",
            &[
                "-I", "FORWARD", "-i", &bridge, "-o", &bridge, "-j", "ACCEPT",
            ],
        );
        for &id in &self.node_ids.clone() {
            let namespace = self.namespace(id);
            let host_veth = self.host_veth(id);
            let inner_veth = format!("tn{}i{id}", self.tag);
            let address = format!("{}/24", self.ip_of(id));
            run_quiet("ip", &["netns", "add", &namespace])?;
            run_quiet(
                "ip",
                &[
                    "link",
                    "add",
                    &host_veth,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    &inner_veth,
                ],
            )?;
            run_quiet("ip", &["link", "set", &host_veth, "master", &bridge])?;
            run_quiet("ip", &["link", "set", &host_veth, "up"])?;
            run_quiet("ip", &["link", "set", &inner_veth, "netns", &namespace])?;
            let in_ns = |args: &[&str]| {
                let mut full = vec!["netns", "exec", namespace.as_str()];
                full.extend_from_slice(args);
                run_quiet("ip", &full)
            };
            in_ns(&["ip", "link", "set", "lo", "up"])?;
            in_ns(&["ip", "addr", "add", &address, "dev", &inner_veth])?;
            in_ns(&["ip", "link", "set", &inner_veth, "up"])?;
        }
        self.write_rules(&BTreeSet::new())
    }

    /// The kind of network.
    pub fn mode(&self) -> NetworkMode {
        self.mode
    }

    /// Node `id`'s QUIC and HTTP addresses.
    pub fn node_addrs(&self, id: u64) -> (SocketAddr, SocketAddr) {
        match self.mode {
            NetworkMode::Namespaces => {
                let ip = IpAddr::V4(self.ip_of(id));
                (
                    SocketAddr::new(ip, NS_QUIC_PORT),
                    SocketAddr::new(ip, NS_HTTP_PORT),
                )
            }
            NetworkMode::Loopback => {
                let index = self.node_ids.iter().position(|&n| n == id).unwrap_or(0);
                self.loopback_addrs[index]
            }
        }
    }

    /// The IP addresses node certificates must be valid for.
    pub fn certificate_ips(&self) -> Vec<IpAddr> {
        match self.mode {
            NetworkMode::Namespaces => self
                .node_ids
                .iter()
                .map(|&id| IpAddr::V4(self.ip_of(id)))
                .collect(),
            NetworkMode::Loopback => vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
        }
    }

    /// The words that run a command inside node `id`'s namespace (empty on loopback).
    pub fn command_prefix(&self, id: u64) -> Vec<String> {
        match self.mode {
            NetworkMode::Namespaces => vec![
                "ip".into(),
                "netns".into(),
                "exec".into(),
                self.namespace(id),
            ],
            NetworkMode::Loopback => Vec::new(),
        }
    }

    /// Cuts exactly the directed links `blocked` (`(a, b)`: node `a` neither sends to nor hears
    /// from `b`), healing every other. Namespaces only; on loopback the caller uses the nodes'
    /// fault control.
    pub fn write_rules(&self, blocked: &BTreeSet<(u64, u64)>) -> Result<(), String> {
        if self.mode != NetworkMode::Namespaces {
            return Err("partitions on loopback go through the nodes' fault control".into());
        }
        for &id in &self.node_ids {
            let mut rules = String::from(
                "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n",
            );
            for &(from, to) in blocked {
                if from == id {
                    let peer = self.ip_of(to);
                    rules.push_str(&format!("-A INPUT -s {peer} -j DROP\n"));
                    rules.push_str(&format!("-A OUTPUT -d {peer} -j DROP\n"));
                }
            }
            rules.push_str("COMMIT\n");
            let namespace = self.namespace(id);
            let mut child = Command::new("ip")
                .args(["netns", "exec", &namespace, "iptables-restore"])
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| format!("iptables-restore in {namespace}: {e}"))?;
            if let Some(mut stdin) = child.stdin.take() {
                stdin
                    .write_all(rules.as_bytes())
                    .map_err(|e| format!("iptables-restore in {namespace}: {e}"))?;
            }
            let output = child
                .wait_with_output()
                .map_err(|e| format!("iptables-restore in {namespace}: {e}"))?;
            if !output.status.success() {
                return Err(format!(
                    "iptables-restore in {namespace}: {}",
                    String::from_utf8_lossy(&output.stderr).trim()
                ));
            }
        }
        Ok(())
    }

    fn teardown(&mut self) {
        if self.mode != NetworkMode::Namespaces || self.tag.is_empty() {
            return;
        }
        teardown_tag(&self.tag, &self.node_ids);
        if let Some(marker) = self.marker.take() {
            let _ = std::fs::remove_file(marker);
        }
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        self.teardown();
    }
}

fn teardown_tag(tag: &str, node_ids: &[u64]) {
    let bridge = format!("tn{tag}br");
    for &id in node_ids {
        let _ = run_quiet("ip", &["link", "del", &format!("tn{tag}h{id}")]);
        let _ = run_quiet("ip", &["netns", "del", &format!("tnem-{tag}-n{id}")]);
    }
    let _ = run_quiet(
        "iptables",
        &[
            "-D", "FORWARD", "-i", &bridge, "-o", &bridge, "-j", "ACCEPT",
        ],
    );
    let _ = run_quiet("ip", &["link", "del", &bridge]);
}

/// Removes the namespaces and links of runs whose process is gone.
fn remove_stale_runs() {
    let Ok(entries) = std::fs::read_dir(MARKER_DIR) else {
        return;
    };
    for entry in entries.flatten() {
        let tag = entry.file_name().to_string_lossy().into_owned();
        let alive = std::fs::read_to_string(entry.path())
            .ok()
            .and_then(|text| text.split_whitespace().next()?.parse::<u32>().ok())
            .is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
        if !alive {
            // Node ids of a run are small: remove every one a run could have made.
            let ids: Vec<u64> = (1..=9).collect();
            teardown_tag(&tag, &ids);
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// A third octet no interface of this host uses yet.
fn free_subnet(start: u32) -> Result<u8, String> {
    let output = Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .output()
        .map_err(|e| format!("ip addr: {e}"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    for step in 0..250u32 {
        let candidate = u8::try_from(1 + (start.wrapping_add(step) % 250)).unwrap_or(1);
        let prefix = format!(" {}.{}.{candidate}.", SUBNET_PREFIX[0], SUBNET_PREFIX[1]);
        if !text.contains(&prefix) {
            return Ok(candidate);
        }
    }
    Err("no free 10.213.x.0/24 subnet".into())
}
