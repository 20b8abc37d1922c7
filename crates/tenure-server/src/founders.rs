//! The founding nodes' data directory incarnations, pinned in `DATA_DIR/FOUNDERS` before a new
//! cluster's replicas open: the half of the replica gate (`crate::replica_gate`) that covers a
//! cluster's birth.
//!
//! A new cluster's founders open their replicas to each other before the replicated node table
//! exists, so for those first seconds the table cannot tell a founder that lost its data from
//! one that never ran. Each founder therefore asks every other one for its incarnation (the
//! `ClusterNodes` answer of a node without a table lists its pins, itself included) and writes
//! them here, durably, before its own replicas open; the first table entry
//! (`ClusterOp::RecordFounders`) then carries them. A founder that comes back with an empty
//! directory under its old id finds its old incarnation pinned by every founder whose
//! replicas it could have served with, and is excluded.
//!
//! A pin is never replaced: a founder answering with another incarnation than the one pinned
//! lost its data after it was pinned, and must stay refused.
//!
//! The file is TOML, versioned by its `format` key, pinned by a golden test below.
//!
//! Must not depend on: the storage engine, the network, or the rest of the node.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};
use tenure_core::CLUSTER_NODES_MAX;

use crate::ServerError;

/// Name of the pins file inside the data directory.
pub const FOUNDERS_FILE: &str = "FOUNDERS";
/// Name of the temporary file the pins are written to before being renamed into place.
const FOUNDERS_TEMP_FILE: &str = "FOUNDERS.tmp";
/// The format this build writes and reads.
pub const FOUNDERS_FORMAT: u32 = 1;
/// Largest pins file read (1,024 pins take about 60 KiB).
const FOUNDERS_FILE_BYTES_MAX: u64 = 256 * 1024;

/// Pinned incarnations by node id (nonzero values).
pub type FounderPins = BTreeMap<u64, u64>;

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FoundersFile {
    format: u32,
    #[serde(default)]
    founders: Vec<Pin>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Pin {
    node_id: u64,
    incarnation: u64,
}

/// Reads the pins of `data_dir` (empty when the file does not exist). A garbled, oversized or
/// newer-format file is an error, never ignored: it is what keeps a founder that lost its data
/// out.
pub fn read_founder_pins(data_dir: &Path) -> Result<FounderPins, ServerError> {
    let path = data_dir.join(FOUNDERS_FILE);
    let garbled = |reason: String| {
        ServerError::DataDir(format!(
            "{} is garbled ({reason}); it is never overwritten: restore it (it pins the founding \
             nodes' data directories)",
            path.display()
        ))
    };
    let size = match fs::metadata(&path) {
        Ok(metadata) => metadata.len(),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            return Ok(FounderPins::new());
        }
        Err(error) => {
            return Err(ServerError::DataDir(format!(
                "cannot read {}: {error}",
                path.display()
            )));
        }
    };
    if size > FOUNDERS_FILE_BYTES_MAX {
        return Err(garbled(format!(
            "{size} bytes, more than {FOUNDERS_FILE_BYTES_MAX}"
        )));
    }
    let bytes = fs::read(&path)
        .map_err(|e| ServerError::DataDir(format!("cannot read {}: {e}", path.display())))?;
    let text = String::from_utf8(bytes).map_err(|e| garbled(e.to_string()))?;
    parse(&text).map_err(garbled)
}

fn parse(text: &str) -> Result<FounderPins, String> {
    let file: FoundersFile = toml::from_str(text).map_err(|e| e.message().to_owned())?;
    if file.format != FOUNDERS_FORMAT {
        return Err(format!(
            "format {} (this build reads format {FOUNDERS_FORMAT})",
            file.format
        ));
    }
    if file.founders.len() > CLUSTER_NODES_MAX {
        return Err(format!("more than {CLUSTER_NODES_MAX} founders"));
    }
    let mut pins = FounderPins::new();
    for pin in file.founders {
        if pin.node_id == 0 || pin.incarnation == 0 {
            return Err(format!(
                "node {} pinned with incarnation {}: both must be nonzero",
                pin.node_id, pin.incarnation
            ));
        }
        if pins.insert(pin.node_id, pin.incarnation).is_some() {
            return Err(format!("node {} pinned twice", pin.node_id));
        }
    }
    Ok(pins)
}

fn render(pins: &FounderPins) -> Result<String, ServerError> {
    let file = FoundersFile {
        format: FOUNDERS_FORMAT,
        founders: pins
            .iter()
            .map(|(&node_id, &incarnation)| Pin {
                node_id,
                incarnation,
            })
            .collect(),
    };
    let body = toml::to_string(&file)
        .map_err(|e| ServerError::DataDir(format!("cannot encode the founder pins: {e}")))?;
    Ok(format!(
        "# The founding nodes' data directory incarnations, pinned before this node's replicas \
         first opened. Written by tenure; never edit.\n{body}"
    ))
}

/// Writes `pins` to `data_dir` durably (temporary file, fsync, rename, directory fsync).
pub fn write_founder_pins(data_dir: &Path, pins: &FounderPins) -> Result<(), ServerError> {
    let text = render(pins)?;
    crate::identity::write_durably(data_dir, FOUNDERS_FILE, FOUNDERS_TEMP_FILE, &text)
}

/// A node pinned with another incarnation than the one it reports now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinConflict {
    /// The node.
    pub node_id: u64,
    /// Its pinned incarnation.
    pub pinned: u64,
    /// The one it reports.
    pub reported: u64,
}

/// `pins` with every `(node, incarnation)` of `reported` added that is not pinned yet (0, "not
/// known", is skipped). A pin is never replaced: the nodes reported with another incarnation
/// than their pin are returned beside.
pub fn merge_pins(
    pins: &FounderPins,
    reported: impl IntoIterator<Item = (u64, u64)>,
) -> (FounderPins, Vec<PinConflict>) {
    let mut merged = pins.clone();
    let mut conflicts = Vec::new();
    for (node_id, incarnation) in reported {
        if node_id == 0 || incarnation == 0 {
            continue;
        }
        match merged.get(&node_id) {
            None => {
                merged.insert(node_id, incarnation);
            }
            Some(&pinned) if pinned != incarnation => conflicts.push(PinConflict {
                node_id,
                pinned,
                reported: incarnation,
            }),
            Some(_) => {}
        }
    }
    (merged, conflicts)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// The file's bytes are a disk format: a change needs a new `format`.
    const GOLDEN: &str = "# The founding nodes' data directory incarnations, pinned before this \
node's replicas first opened. Written by tenure; never edit.
format = 1

[[founders]]
node_id = 1
incarnation = 1764000000001

[[founders]]
node_id = 3
incarnation = 1764000000003
";

    fn pins() -> FounderPins {
        FounderPins::from([(1, 1_764_000_000_001), (3, 1_764_000_000_003)])
    }

    #[test]
    fn the_file_format_is_pinned() {
        assert_eq!(render(&pins()).unwrap(), GOLDEN);
        assert_eq!(parse(GOLDEN).unwrap(), pins());
    }

    #[test]
    fn pins_round_trip_durably_and_a_missing_file_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read_founder_pins(dir.path()).unwrap().is_empty());
        write_founder_pins(dir.path(), &pins()).unwrap();
        assert_eq!(read_founder_pins(dir.path()).unwrap(), pins());
        assert!(!dir.path().join(FOUNDERS_TEMP_FILE).exists());
    }

    #[test]
    fn bad_files_are_errors_not_empty_pins() {
        for bad in [
            "format = 2\n",
            "format = 1\n[[founders]]\nnode_id = 1\nincarnation = 0\n",
            "format = 1\n[[founders]]\nnode_id = 0\nincarnation = 5\n",
            "format = 1\n[[founders]]\nnode_id = 1\nincarnation = 5\n[[founders]]\nnode_id = 1\nincarnation = 6\n",
            "format = 1\nextra = true\n",
            "not toml at all [",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} must be refused");
        }
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(FOUNDERS_FILE), [0xff, 0xfe]).unwrap();
        assert!(read_founder_pins(dir.path()).is_err());
        let huge = "#".repeat(usize::try_from(FOUNDERS_FILE_BYTES_MAX).unwrap() + 1);
        fs::write(dir.path().join(FOUNDERS_FILE), huge).unwrap();
        assert!(read_founder_pins(dir.path()).is_err());
    }

    #[test]
    fn a_pin_is_never_replaced() {
        let (merged, conflicts) =
            merge_pins(&pins(), [(1, 1_764_000_000_001), (2, 22), (3, 99), (4, 0)]);
        assert_eq!(
            merged,
            FounderPins::from([(1, 1_764_000_000_001), (2, 22), (3, 1_764_000_000_003)])
        );
        assert_eq!(
            conflicts,
            vec![PinConflict {
                node_id: 3,
                pinned: 1_764_000_000_003,
                reported: 99
            }]
        );
    }
}
