//! `tenure certs`: the cluster CA and one certificate per node, written as the configuration's
//! `[tls]` section expects them (`ca.pem`, `ca.key`, `node-ID.pem`, `node-ID.key`); or, for a
//! node added to a running cluster, one more node certificate from the existing CA
//! ([`issue_from_existing_ca`]).
//!
//! Generation and the never-overwrite rule are `tenure_transport::certs::write_cluster_certificates`;
//! this module chooses the node ids, names and addresses.
//!
//! Must not depend on: a running node or the network (it only writes files).

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use tenure_transport::certs::{
    CertificatePaths, ClusterCa, issue_node_certificate, write_cluster_certificates,
};
use tenure_transport::tls::{CA_CERT_FILE, CA_KEY_FILE, node_cert_file_name, node_key_file_name};

use crate::ServerError;
use crate::config::ServerConfig;

/// Generates a cluster CA named `cluster_name` and a certificate for each of `node_ids` into
/// `out` (created if missing). Every node certificate carries the DNS name
/// `node-ID.tenure.internal` (which peers verify) and every address of `ips` as IP SANs (for
/// clients that connect by address). Never overwrites an existing file.
pub fn generate(
    out: &Path,
    cluster_name: &str,
    node_ids: &[u64],
    ips: &[IpAddr],
) -> Result<CertificatePaths, ServerError> {
    if node_ids.is_empty() {
        return Err(ServerError::Config(
            "no node ids to issue certificates for".into(),
        ));
    }
    if node_ids.contains(&0) {
        return Err(ServerError::Config(
            "node ids start at 1 (0 is not a node id)".into(),
        ));
    }
    Ok(write_cluster_certificates(
        out,
        cluster_name,
        node_ids,
        ips,
    )?)
}

/// Issues a certificate for each of `node_ids` from the cluster CA in `ca_dir` (`ca.pem`,
/// `ca.key`), each with the IP SANs `ips`, into `out`: `node-ID.pem` and `node-ID.key` (mode
/// 0600), synced. Never overwrites: an existing file fails the call before anything is written.
/// Returns node id, certificate and key path per node.
pub fn issue_from_existing_ca(
    ca_dir: &Path,
    node_ids: &[u64],
    ips: &[IpAddr],
    out: &Path,
) -> Result<Vec<(u64, PathBuf, PathBuf)>, ServerError> {
    if node_ids.is_empty() || node_ids.contains(&0) {
        return Err(ServerError::Config(
            "give the new nodes' ids (>= 1) with --nodes".into(),
        ));
    }
    let ca = ClusterCa::load(&ca_dir.join(CA_CERT_FILE), &ca_dir.join(CA_KEY_FILE))?;
    std::fs::create_dir_all(out)
        .map_err(|e| ServerError::io(format!("creating {}", out.display()), e))?;
    let paths: Vec<(u64, PathBuf, PathBuf)> = node_ids
        .iter()
        .map(|&id| {
            (
                id,
                out.join(node_cert_file_name(id)),
                out.join(node_key_file_name(id)),
            )
        })
        .collect();
    for (_, cert, key) in &paths {
        for path in [cert, key] {
            if path.exists() {
                return Err(ServerError::Config(format!(
                    "{} exists; it is never overwritten",
                    path.display()
                )));
            }
        }
    }
    for (id, cert_path, key_path) in &paths {
        let issued = issue_node_certificate(&ca, *id, ips)?;
        write_new_file(cert_path, issued.cert_pem.as_bytes(), 0o644)?;
        write_new_file(key_path, issued.key_pem.as_bytes(), 0o600)?;
    }
    if let Ok(dir) = std::fs::File::open(out) {
        let _ = dir.sync_all();
    }
    Ok(paths)
}

fn write_new_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), ServerError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let io = |e| ServerError::io(format!("writing {}", path.display()), e);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(io)?;
    file.write_all(bytes).map_err(io)?;
    file.sync_all().map_err(io)
}

/// The IP addresses of every peer of `config` (QUIC and HTTP), without unspecified addresses
/// (`0.0.0.0`, `::`), sorted. Every node certificate gets all of them: they are all members of one
/// cluster, trusted alike, and the files are generated in one go.
pub fn peer_ips(config: &ServerConfig) -> Vec<IpAddr> {
    let ips: BTreeSet<IpAddr> = config
        .peers
        .values()
        .flat_map(|peer| [peer.addr.ip(), peer.http_addr.ip()])
        .filter(|ip| !ip.is_unspecified())
        .collect();
    ips.into_iter().collect()
}

/// Where `tenure certs --config FILE` writes when `--out` is not given: the directory of the
/// configuration's `tls.ca_cert`.
pub fn default_out_dir(config: &ServerConfig) -> PathBuf {
    config
        .tls
        .ca_cert
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// Generates the CA and every peer's certificate for `config` into `out` (by default
/// [`default_out_dir`]), named after the configuration's cluster.
pub fn generate_for_config(
    config: &ServerConfig,
    out: Option<&Path>,
) -> Result<CertificatePaths, ServerError> {
    let out = out.map_or_else(|| default_out_dir(config), Path::to_path_buf);
    let node_ids: Vec<u64> = config.peers.keys().copied().collect();
    generate(&out, &config.cluster_name, &node_ids, &peer_ips(config))
}

/// The configuration's `[tls]` paths that differ from the files just written for its node, as
/// `(field, configured, written)`, so the command can say what to change.
pub fn mismatched_tls_paths(
    config: &ServerConfig,
    written: &CertificatePaths,
) -> Vec<(&'static str, PathBuf, PathBuf)> {
    let mut out = Vec::new();
    let mut check = |field, configured: &Path, written: &Path| {
        let same = match (configured.canonicalize(), written.canonicalize()) {
            (Ok(a), Ok(b)) => a == b,
            _ => configured == written,
        };
        if !same {
            out.push((field, configured.to_path_buf(), written.to_path_buf()));
        }
    };
    check("tls.ca_cert", &config.tls.ca_cert, &written.ca_cert);
    if let Some((_, cert, key)) = written
        .nodes
        .iter()
        .find(|(id, _, _)| *id == config.node_id)
    {
        check("tls.node_cert", &config.tls.node_cert, cert);
        check("tls.node_key", &config.tls.node_key, key);
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::collections::BTreeMap;
    use std::net::{Ipv4Addr, SocketAddr};

    use tenure_transport::tls::NodeTls;

    use super::*;
    use crate::config::PeerConfig;

    #[test]
    fn generates_loadable_certificates_and_never_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("certs");
        let ips = [IpAddr::V4(Ipv4Addr::LOCALHOST)];
        let paths = generate(&out, "tenure", &[1, 2, 3], &ips).unwrap();
        assert_eq!(paths.ca_cert, out.join("ca.pem"));
        assert_eq!(paths.nodes.len(), 3);
        for (id, cert, key) in &paths.nodes {
            NodeTls::load(*id, &paths.ca_cert, cert, key).unwrap();
        }
        let before = std::fs::read(&paths.ca_cert).unwrap();
        assert!(generate(&out, "tenure", &[1, 2, 3], &ips).is_err());
        assert!(generate(&out, "tenure", &[4], &ips).is_err());
        assert_eq!(std::fs::read(&paths.ca_cert).unwrap(), before);

        assert!(generate(&dir.path().join("x"), "tenure", &[], &ips).is_err());
        assert!(generate(&dir.path().join("y"), "tenure", &[0], &ips).is_err());
    }

    #[test]
    fn config_mode_uses_every_peer_and_the_configured_directory() {
        let dir = tempfile::tempdir().unwrap();
        let certs = dir.path().join("certs");
        let mut peers = BTreeMap::new();
        for id in 1..=3u16 {
            peers.insert(
                u64::from(id),
                PeerConfig {
                    addr: SocketAddr::from(([10, 0, 0, u8::try_from(id).unwrap()], 7400 + id)),
                    http_addr: SocketAddr::from(([0, 0, 0, 0], 7500 + id)),
                },
            );
        }
        let config = ServerConfig::with_defaults(2, dir.path().join("data"), peers, &certs);
        assert_eq!(peer_ips(&config).len(), 3);
        let paths = generate_for_config(&config, None).unwrap();
        assert_eq!(paths.ca_cert, certs.join("ca.pem"));
        assert!(mismatched_tls_paths(&config, &paths).is_empty());

        let other = dir.path().join("elsewhere");
        let paths = generate_for_config(&config, Some(&other)).unwrap();
        let mismatched = mismatched_tls_paths(&config, &paths);
        assert_eq!(mismatched.len(), 3, "{mismatched:?}");
    }
}
