//! Client configuration: where the cluster is, who we are, and every bound and timing the client
//! uses, with documented defaults. Also reads `cluster.json` as `tenure dev` writes it.
//!
//! Must not depend on: connections or the runtime; this module only holds and checks values.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::ClientError;

/// One node to contact first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The node's id when known (`id@host:port`); the node's certificate is then checked for
    /// exactly that node. Without it, any certificate signed by the cluster CA is accepted for
    /// this first contact, and the routing table it returns names the nodes from then on.
    pub node_id: Option<u64>,
    /// Its QUIC address.
    pub addr: SocketAddr,
}

impl Endpoint {
    /// Parses `host:port` or `id@host:port`.
    ///
    /// ```
    /// use tenure_client::Endpoint;
    /// let endpoint = Endpoint::parse("2@127.0.0.1:7402").unwrap();
    /// assert_eq!(endpoint.node_id, Some(2));
    /// assert_eq!(endpoint.addr.port(), 7402);
    /// assert_eq!(Endpoint::parse("127.0.0.1:7401").unwrap().node_id, None);
    /// assert!(Endpoint::parse("x@127.0.0.1:1").is_err());
    /// ```
    pub fn parse(text: &str) -> Result<Self, ClientError> {
        let text = text.trim();
        let (node_id, address) = match text.split_once('@') {
            Some((id, address)) => {
                let id = id.parse::<u64>().map_err(|_| {
                    ClientError::Config(format!(
                        "endpoint {text:?}: {id:?} is not a node id (expected id@host:port)"
                    ))
                })?;
                (Some(id), address)
            }
            None => (None, text),
        };
        let addr = address
            .to_socket_addrs()
            .map_err(|error| ClientError::Config(format!("endpoint {text:?}: {error}")))?
            .next()
            .ok_or_else(|| ClientError::Config(format!("endpoint {text:?} has no address")))?;
        Ok(Endpoint { node_id, addr })
    }

    /// Parses a comma-separated list of endpoints.
    pub fn parse_list(text: &str) -> Result<Vec<Self>, ClientError> {
        text.split(',')
            .filter(|part| !part.trim().is_empty())
            .map(Endpoint::parse)
            .collect()
    }
}

/// How the client proves who it is.
#[derive(Clone, PartialEq, Eq)]
pub enum Credentials {
    /// A bearer token from the cluster's `[auth]` table; it binds every connection to the
    /// token's tenant.
    Token(String),
    /// Development clusters only (`auth.insecure_dev_mode`, as `tenure dev` runs): requests name
    /// their principal, whose tenant is taken from each request's resource.
    InsecureDev {
        /// The principal named (for the server's logs and metrics).
        principal_id: String,
    },
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::Token(_) => f.write_str("Token(<redacted>)"),
            Credentials::InsecureDev { principal_id } => f
                .debug_struct("InsecureDev")
                .field("principal_id", principal_id)
                .finish(),
        }
    }
}

/// Retries of one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// First backoff after a retryable failure; doubles per attempt (full jitter).
    pub backoff_initial: Duration,
    /// Largest backoff.
    pub backoff_max: Duration,
    /// Most attempts of one call (the first included); the call's deadline may end it sooner.
    pub attempts_max: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            backoff_initial: Duration::from_millis(20),
            backoff_max: Duration::from_millis(1_000),
            attempts_max: 16,
        }
    }
}

/// Automatic renewal of [`crate::Lease`] handles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenewPolicy {
    /// A lease is renewed this fraction of its ttl after the send time of its last confirmed
    /// acquire or renewal, as parts per million (default 333,333: one third).
    pub renew_after_ppm: u32,
    /// Leases of the same (group, tenant) due within this window of now are renewed in the
    /// Batch request of that queue's most urgent due lease (so renewal cohorts form and stay
    /// aligned). Capped at one sixth of the lease's ttl, so a lease is never renewed before a
    /// sixth of its ttl passed.
    pub coalesce_window: Duration,
    /// Most renewals in one Batch request (the server's proposer packs at most 256 operations
    /// per log entry; a Batch is never split).
    pub batch_ops_max: usize,
    /// Most renewal Batch requests in flight at once (back-pressure on the renewer).
    pub batches_inflight_max: usize,
    /// The loss signal fires this long before the safe deadline when no renewal was confirmed
    /// (capped at a tenth of the ttl), so a holder stops before its window ends, not after.
    pub loss_signal_lead: Duration,
}

impl Default for RenewPolicy {
    fn default() -> Self {
        RenewPolicy {
            renew_after_ppm: 333_333,
            coalesce_window: Duration::from_millis(500),
            batch_ops_max: 256,
            batches_inflight_max: 64,
            loss_signal_lead: Duration::from_millis(100),
        }
    }
}

/// The clock assumptions of the safe deadline (contract section 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SafetyPolicy {
    /// Largest rate difference between monotonic clocks, parts per million (default 10,000 =
    /// 1%, the cluster's `max_drift`). Must not be lower than the cluster's.
    pub max_drift_ppm: u32,
    /// Margin as a fraction of the ttl, parts per million (default 10,000 = 1%).
    pub margin_ppm: u32,
    /// Fixed part of the margin (default 50 ms).
    pub margin_fixed: Duration,
}

impl Default for SafetyPolicy {
    fn default() -> Self {
        SafetyPolicy {
            max_drift_ppm: 10_000,
            margin_ppm: 10_000,
            margin_fixed: Duration::from_millis(50),
        }
    }
}

impl SafetyPolicy {
    /// How long after the send time of a successful Acquire or Renew with `ttl_ms` its holder may
    /// act: `ttl * (1 - max_drift) - (ttl * margin + margin_fixed)`, zero when that is negative.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tenure_client::SafetyPolicy;
    /// let policy = SafetyPolicy::default();
    /// // 10 s ttl: 10,000 - 100 (drift) - 100 (1% margin) - 50 ms.
    /// assert_eq!(policy.safe_window(10_000), Duration::from_millis(9_750));
    /// assert_eq!(policy.safe_window(40), Duration::ZERO);
    /// ```
    pub fn safe_window(&self, ttl_ms: u64) -> Duration {
        let ttl_us = u128::from(ttl_ms) * 1_000;
        let drift_us = ttl_us * u128::from(self.max_drift_ppm) / 1_000_000;
        let margin_us =
            ttl_us * u128::from(self.margin_ppm) / 1_000_000 + self.margin_fixed.as_micros();
        let window_us = ttl_us.saturating_sub(drift_us + margin_us);
        Duration::from_micros(u64::try_from(window_us).unwrap_or(u64::MAX))
    }
}

/// Everything a [`crate::Client`] needs.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Nodes to ask for the routing table first (any one reachable suffices).
    pub endpoints: Vec<Endpoint>,
    /// PEM of the cluster CA the nodes' certificates chain to.
    pub ca_cert_pem: String,
    /// Who the client acts for.
    pub credentials: Credentials,
    /// Overall deadline of one call, all retries included (default 10 s).
    pub call_timeout: Duration,
    /// Deadline of one attempt; a lost response is detected after it and the request is sent
    /// again with the same request id (default 3 s).
    pub attempt_timeout: Duration,
    /// Retries.
    pub retry: RetryPolicy,
    /// Most requests in flight to one node; more calls wait (back-pressure) until their deadline
    /// (default 4,096).
    pub inflight_per_node_max: usize,
    /// Long-lived QUIC streams per node connection; concurrent calls share their frames
    /// (default 2).
    pub lanes_per_node: usize,
    /// Most requests one frame carries (default 1,024; the protocol allows 4,096).
    pub frame_requests_max: usize,
    /// Routing is refreshed at most this often after routing errors (default 100 ms).
    pub routing_refresh_min_interval: Duration,
    /// Lease renewal.
    pub renew: RenewPolicy,
    /// The safe deadline's clock assumptions.
    pub safety: SafetyPolicy,
    /// Seed of the backoff jitter (`None`: from the operating system). Tests set it. Request ids
    /// never depend on it (they start with the client id).
    pub seed: Option<u64>,
    /// The id generated request ids start with (`None`: drawn from the operating system, the
    /// right choice outside a simulation: two clients must never share one).
    pub client_id: Option<u64>,
}

impl ClientConfig {
    /// A configuration with the defaults for the given endpoints, CA and credentials.
    pub fn new(endpoints: Vec<Endpoint>, ca_cert_pem: String, credentials: Credentials) -> Self {
        ClientConfig {
            endpoints,
            ca_cert_pem,
            credentials,
            call_timeout: Duration::from_secs(10),
            attempt_timeout: Duration::from_secs(3),
            retry: RetryPolicy::default(),
            inflight_per_node_max: 4_096,
            lanes_per_node: 2,
            frame_requests_max: 1_024,
            routing_refresh_min_interval: Duration::from_millis(100),
            renew: RenewPolicy::default(),
            safety: SafetyPolicy::default(),
            seed: None,
            client_id: None,
        }
    }

    /// Reads a `cluster.json` (as `tenure dev` writes it: `{"nodes": [{"id", "client", "http"}],
    /// "groups", "ca_cert"}`); every node becomes an endpoint and `ca_cert` (a path, relative to
    /// the file's directory when relative) is read as the CA.
    pub fn from_cluster_file(path: &Path, credentials: Credentials) -> Result<Self, ClientError> {
        let cluster = ClusterFile::read(path)?;
        let ca_cert_pem = std::fs::read_to_string(&cluster.ca_cert).map_err(|error| {
            ClientError::Config(format!(
                "reading the CA certificate {} named by {}: {error}",
                cluster.ca_cert.display(),
                path.display()
            ))
        })?;
        Ok(ClientConfig::new(
            cluster.endpoints,
            ca_cert_pem,
            credentials,
        ))
    }

    /// Checks the bounds; every [`crate::Client::connect`] does.
    pub fn validate(&self) -> Result<(), ClientError> {
        let fail = |message: &str| Err(ClientError::Config(message.to_string()));
        if self.endpoints.is_empty() {
            return fail("no endpoints: name at least one node (host:port or id@host:port)");
        }
        if self.ca_cert_pem.trim().is_empty() {
            return fail("ca_cert_pem is empty: the cluster CA certificate is required");
        }
        if self.call_timeout.is_zero() || self.attempt_timeout.is_zero() {
            return fail("call_timeout and attempt_timeout must be positive");
        }
        if self.retry.attempts_max == 0 {
            return fail("retry.attempts_max must be at least 1");
        }
        if self.inflight_per_node_max == 0 || self.lanes_per_node == 0 {
            return fail("inflight_per_node_max and lanes_per_node must be at least 1");
        }
        if self.frame_requests_max == 0
            || self.frame_requests_max > tenure_proto::client::REQUESTS_PER_FRAME_MAX
        {
            return fail(&format!(
                "frame_requests_max must be within [1, {}]",
                tenure_proto::client::REQUESTS_PER_FRAME_MAX
            ));
        }
        // Renewing later than 90% of the ttl would come after the safe deadline (98% of the ttl
        // less 50 ms by default).
        if !(1..=900_000).contains(&self.renew.renew_after_ppm) {
            return fail("renew.renew_after_ppm must be within [1, 900000]");
        }
        let hour = Duration::from_secs(3_600);
        if self.call_timeout > hour || self.attempt_timeout > hour {
            return fail("call_timeout and attempt_timeout must be at most one hour");
        }
        if self.renew.batch_ops_max == 0
            || self.renew.batch_ops_max > tenure_proto::client::BATCH_OPS_MAX
            || self.renew.batches_inflight_max == 0
        {
            return fail(&format!(
                "renew.batch_ops_max must be within [1, {}] and batches_inflight_max at least 1",
                tenure_proto::client::BATCH_OPS_MAX
            ));
        }
        if self.safety.max_drift_ppm >= 500_000 || self.safety.margin_ppm >= 500_000 {
            return fail("safety.max_drift_ppm and margin_ppm must be below 500000");
        }
        Ok(())
    }
}

/// The parts of `cluster.json` a client uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterFile {
    /// Every node, with its id.
    pub endpoints: Vec<Endpoint>,
    /// Number of groups, when the file says.
    pub groups: Option<u32>,
    /// Path of the cluster CA certificate.
    pub ca_cert: PathBuf,
}

#[derive(serde::Deserialize)]
struct ClusterJson {
    nodes: Vec<ClusterJsonNode>,
    groups: Option<u32>,
    ca_cert: Option<PathBuf>,
}

#[derive(serde::Deserialize)]
struct ClusterJsonNode {
    id: u64,
    client: String,
}

impl ClusterFile {
    /// Reads and checks a cluster file.
    pub fn read(path: &Path) -> Result<Self, ClientError> {
        let text = std::fs::read_to_string(path).map_err(|error| {
            ClientError::Config(format!(
                "reading the cluster file {}: {error}",
                path.display()
            ))
        })?;
        Self::parse(&text, path.parent().unwrap_or(Path::new(".")))
            .map_err(|error| ClientError::Config(format!("{}: {error}", path.display())))
    }

    /// Parses a cluster file's text; a relative `ca_cert` is taken relative to `base_dir`.
    ///
    /// ```
    /// use std::path::Path;
    /// use tenure_client::ClusterFile;
    /// let text = r#"{"nodes": [{"id": 1, "client": "127.0.0.1:7401", "http": "http://127.0.0.1:8401"}],
    ///                "groups": 64, "ca_cert": "certs/ca.pem"}"#;
    /// let file = ClusterFile::parse(text, Path::new("/tmp/dev")).unwrap();
    /// assert_eq!(file.endpoints[0].node_id, Some(1));
    /// assert_eq!(file.ca_cert, Path::new("/tmp/dev/certs/ca.pem"));
    /// ```
    pub fn parse(text: &str, base_dir: &Path) -> Result<Self, String> {
        let json: ClusterJson =
            serde_json::from_str(text).map_err(|error| format!("not a cluster file: {error}"))?;
        if json.nodes.is_empty() {
            return Err("the cluster file lists no nodes".to_string());
        }
        let endpoints = json
            .nodes
            .iter()
            .map(|node| {
                Endpoint::parse(&node.client).map(|endpoint| Endpoint {
                    node_id: Some(node.id),
                    addr: endpoint.addr,
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| error.to_string())?;
        let ca_cert = json
            .ca_cert
            .ok_or("the cluster file has no \"ca_cert\" (path of the cluster CA certificate)")?;
        let ca_cert = if ca_cert.is_relative() {
            base_dir.join(ca_cert)
        } else {
            ca_cert
        };
        Ok(ClusterFile {
            endpoints,
            groups: json.groups,
            ca_cert,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn safe_window_matches_the_contract_formula() {
        let policy = SafetyPolicy::default();
        // 4,500 ms: 4,500 - 45 - 45 - 50.
        assert_eq!(policy.safe_window(4_500), Duration::from_millis(4_360));
        assert_eq!(policy.safe_window(0), Duration::ZERO);
        assert!(policy.safe_window(u64::MAX) > Duration::from_secs(1));
        let strict = SafetyPolicy {
            max_drift_ppm: 50_000,
            ..policy
        };
        assert_eq!(strict.safe_window(10_000), Duration::from_millis(9_350));
    }

    #[test]
    fn validation_names_the_bad_field() {
        let endpoint = Endpoint::parse("127.0.0.1:1").unwrap();
        let mut config =
            ClientConfig::new(vec![endpoint], "pem".into(), Credentials::Token("t".into()));
        assert!(config.validate().is_ok());
        config.frame_requests_max = 5_000;
        let error = config.validate().unwrap_err().to_string();
        assert!(error.contains("frame_requests_max"), "{error}");
        assert!(!format!("{:?}", Credentials::Token("secret".into())).contains("secret"));
    }

    #[test]
    fn cluster_file_errors_are_clear() {
        let base = Path::new("/x");
        assert!(
            ClusterFile::parse("{", base)
                .unwrap_err()
                .contains("not a cluster file")
        );
        assert!(
            ClusterFile::parse(r#"{"nodes": [], "ca_cert": "a"}"#, base)
                .unwrap_err()
                .contains("no nodes")
        );
        assert!(
            ClusterFile::parse(r#"{"nodes": [{"id": 1, "client": "127.0.0.1:1"}]}"#, base)
                .unwrap_err()
                .contains("ca_cert")
        );
    }
}
