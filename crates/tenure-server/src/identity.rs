//! The data directory's owner: which node of which cluster a data directory belongs to.
//!
//! The first start writes `DATA_DIR/NODE_IDENTITY` (node id, cluster name, creation time)
//! durably; every later start reads it and refuses a directory of another node or cluster, so a
//! configuration mistake (two nodes sharing a directory, a copied config with the wrong
//! `node_id`) cannot make one node's log and votes another's. A directory that is not empty but
//! has no identity file is refused too (it may belong to another program). An unreadable or
//! garbled identity file is an error and is never overwritten.
//!
//! Must not depend on: the storage engine, the network, or the rest of the node (it runs before
//! anything is opened).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::ServerError;

/// Name of the identity file inside the data directory.
pub const IDENTITY_FILE: &str = "NODE_IDENTITY";
/// Name of the temporary file the identity is written to before it is renamed into place.
const IDENTITY_TEMP_FILE: &str = "NODE_IDENTITY.tmp";

/// The contents of `NODE_IDENTITY` (TOML).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeIdentity {
    /// The node the directory belongs to.
    pub node_id: u64,
    /// The cluster of that node.
    pub cluster_name: String,
    /// When the directory was claimed, in milliseconds since the Unix epoch (informational).
    pub created_unix_ms: u64,
}

/// Reads the identity of `data_dir`, if it has one.
///
/// `Ok(None)` when the identity file does not exist; an error when it exists but cannot be read
/// or parsed.
pub fn read_identity(data_dir: &Path) -> Result<Option<NodeIdentity>, ServerError> {
    let path = data_dir.join(IDENTITY_FILE);
    let bytes = match fs::read(&path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => {
            return Err(ServerError::DataDir(format!(
                "cannot read {}: {error}",
                path.display()
            )));
        }
    };
    let garbled = |reason: String| {
        ServerError::DataDir(format!(
            "{} is garbled ({reason}); it is never overwritten: restore it, or remove it by hand \
             if you are sure the directory belongs to this node",
            path.display()
        ))
    };
    let text = String::from_utf8(bytes).map_err(|e| garbled(e.to_string()))?;
    let identity: NodeIdentity =
        toml::from_str(&text).map_err(|e| garbled(e.message().to_owned()))?;
    Ok(Some(identity))
}

/// Makes sure `data_dir` belongs to node `node_id` of cluster `cluster_name`.
///
/// Creates the directory if missing. In an empty directory, writes the identity file (temporary
/// file, fsync, rename, fsync of the directory). In a directory with an identity file, checks it
/// and fails with [`ServerError::DataDir`] when it names another node or cluster. A non-empty
/// directory without an identity file is refused.
pub fn claim_data_dir(
    data_dir: &Path,
    node_id: u64,
    cluster_name: &str,
) -> Result<(), ServerError> {
    fs::create_dir_all(data_dir)
        .map_err(|e| ServerError::DataDir(format!("cannot create {}: {e}", data_dir.display())))?;
    if let Some(identity) = read_identity(data_dir)? {
        if identity.node_id == node_id && identity.cluster_name == cluster_name {
            return Ok(());
        }
        return Err(ServerError::DataDir(format!(
            "{} belongs to node {} of cluster {:?}, this is node {} of cluster {:?}; point \
             data_dir at this node's own directory",
            data_dir.display(),
            identity.node_id,
            identity.cluster_name,
            node_id,
            cluster_name
        )));
    }
    let foreign = foreign_entries(data_dir)?;
    if !foreign.is_empty() {
        let shown: Vec<String> = foreign.iter().take(5).cloned().collect();
        return Err(ServerError::DataDir(format!(
            "{} is not empty ({}{}) and has no {IDENTITY_FILE} file, so it is not a tenure data \
             directory (it may belong to another program); use an empty or new directory",
            data_dir.display(),
            shown.join(", "),
            if foreign.len() > shown.len() {
                ", ..."
            } else {
                ""
            }
        )));
    }
    let identity = NodeIdentity {
        node_id,
        cluster_name: cluster_name.to_owned(),
        created_unix_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
    };
    write_identity(data_dir, &identity)
}

/// Entries of `dir` other than a leftover temporary identity file.
fn foreign_entries(dir: &Path) -> Result<Vec<String>, ServerError> {
    let read_error =
        |e: std::io::Error| ServerError::DataDir(format!("cannot list {}: {e}", dir.display()));
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).map_err(read_error)? {
        let name = entry.map_err(read_error)?.file_name();
        if name != IDENTITY_TEMP_FILE {
            names.push(name.to_string_lossy().into_owned());
        }
    }
    names.sort();
    Ok(names)
}

fn write_identity(data_dir: &Path, identity: &NodeIdentity) -> Result<(), ServerError> {
    let body = toml::to_string(identity)
        .map_err(|e| ServerError::DataDir(format!("cannot encode the node identity: {e}")))?;
    let text = format!(
        "# Which node of which cluster owns this data directory. Written once by tenure; never \
         edit.\n{body}"
    );
    write_durably(data_dir, IDENTITY_FILE, IDENTITY_TEMP_FILE, &text)
}

/// Writes `text` to `data_dir/name` durably: into `temp_name` first, fsync, rename into place,
/// fsync of the directory. A crash leaves the old file or the new one, never a torn one.
pub(crate) fn write_durably(
    data_dir: &Path,
    name: &str,
    temp_name: &str,
    text: &str,
) -> Result<(), ServerError> {
    let temp: PathBuf = data_dir.join(temp_name);
    let path = data_dir.join(name);
    let io = |what: &str, p: &Path, e: std::io::Error| {
        ServerError::DataDir(format!("cannot {what} {}: {e}", p.display()))
    };
    let mut file = fs::File::create(&temp).map_err(|e| io("create", &temp, e))?;
    file.write_all(text.as_bytes())
        .map_err(|e| io("write", &temp, e))?;
    file.sync_all().map_err(|e| io("sync", &temp, e))?;
    drop(file);
    fs::rename(&temp, &path).map_err(|e| io("rename into place", &path, e))?;
    fs::File::open(data_dir)
        .and_then(|dir| dir.sync_all())
        .map_err(|e| io("sync the directory", data_dir, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn message(error: ServerError) -> String {
        match error {
            ServerError::DataDir(message) => message,
            other => panic!("expected a data directory error, got {other:?}"),
        }
    }

    #[test]
    fn first_claim_writes_identity_and_later_claims_check_it() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("node-1").join("data");
        claim_data_dir(&data, 1, "prod").unwrap();
        let identity = read_identity(&data).unwrap().unwrap();
        assert_eq!(identity.node_id, 1);
        assert_eq!(identity.cluster_name, "prod");
        assert!(identity.created_unix_ms > 0);
        assert!(!data.join(IDENTITY_TEMP_FILE).exists());

        // The node writes its own files; a restart still accepts the directory.
        fs::create_dir(data.join("db")).unwrap();
        claim_data_dir(&data, 1, "prod").unwrap();
        assert_eq!(read_identity(&data).unwrap().unwrap(), identity);
    }

    #[test]
    fn another_node_or_cluster_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        claim_data_dir(dir.path(), 1, "prod").unwrap();
        let text = message(claim_data_dir(dir.path(), 2, "prod").unwrap_err());
        assert!(
            text.contains(
                "belongs to node 1 of cluster \"prod\", this is node 2 of cluster \"prod\""
            ),
            "{text}"
        );
        let text = message(claim_data_dir(dir.path(), 1, "staging").unwrap_err());
        assert!(
            text.contains("this is node 1 of cluster \"staging\""),
            "{text}"
        );
        // Refusing never rewrote the file.
        assert_eq!(read_identity(dir.path()).unwrap().unwrap().node_id, 1);
    }

    #[test]
    fn non_empty_directory_without_identity_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("postgresql.conf"), "x").unwrap();
        let text = message(claim_data_dir(dir.path(), 1, "prod").unwrap_err());
        assert!(text.contains("postgresql.conf"), "{text}");
        assert!(text.contains("not a tenure data directory"), "{text}");
        assert!(!dir.path().join(IDENTITY_FILE).exists());
    }

    #[test]
    fn leftover_temporary_file_does_not_block_a_first_claim() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(IDENTITY_TEMP_FILE), "node_id = 7").unwrap();
        claim_data_dir(dir.path(), 3, "prod").unwrap();
        assert_eq!(read_identity(dir.path()).unwrap().unwrap().node_id, 3);
    }

    #[test]
    fn garbled_identity_is_an_error_and_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(IDENTITY_FILE);
        fs::write(&path, "node_id = \"one\"\n").unwrap();
        let text = message(claim_data_dir(dir.path(), 1, "prod").unwrap_err());
        assert!(text.contains("garbled"), "{text}");
        assert_eq!(fs::read_to_string(&path).unwrap(), "node_id = \"one\"\n");

        fs::write(&path, [0xff, 0xfe, 0x00]).unwrap();
        let text = message(claim_data_dir(dir.path(), 1, "prod").unwrap_err());
        assert!(text.contains("garbled"), "{text}");
        assert_eq!(fs::read(&path).unwrap(), vec![0xff, 0xfe, 0x00]);
    }
}
