//! A full disk: appends fail with a typed error, the store stops accepting writes, and after space
//! is freed and the store reopened every acknowledged entry is still there.
//!
//! Needs root (it mounts a small tmpfs). Without root it says so and checks nothing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::path::Path;
use std::process::Command as Process;
use std::time::Duration;

use openraft::RaftLogReader;
use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::testing::log_id;
use openraft::type_config::TypeConfigExt;
use tenure_core::{AcquireRequest, Command, Entry, LeaseOp, ResourceKey};
use tenure_storage::{LogEntry, NodeStorage, StorageOptions, StoreError, TenureRaft};

/// Unmounts the tmpfs however the test ends.
struct Mount(std::path::PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Process::new("umount").arg("-l").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn mount_tmpfs(dir: &Path, size: &str) -> Option<Mount> {
    std::fs::create_dir_all(dir).ok()?;
    let status = Process::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(dir)
        .status()
        .ok()?;
    status.success().then(|| Mount(dir.to_path_buf()))
}

/// A bulky entry (a batch of acquires) so the disk fills in a few hundred appends.
fn bulky_entry(index: u64) -> LogEntry {
    let ops = (0..40)
        .map(|i| {
            LeaseOp::Acquire(AcquireRequest {
                key: ResourceKey::new("tenant", format!("resource-{index}-{i}-{}", "x".repeat(40))),
                holder_id: "holder".to_owned(),
                ttl_ms: 10_000,
                request_id: format!("request-{index}-{i}"),
            })
        })
        .collect();
    LogEntry::new_normal(
        log_id::<TenureRaft>(1, 0, index),
        Entry {
            log_time_ms: index,
            command: Command::Batch(ops),
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_stops_writes_with_a_typed_error_and_loses_nothing_acknowledged() {
    let root = std::env::temp_dir().join(format!("tenure-disk-full-{}", std::process::id()));
    let Some(mount) = mount_tmpfs(&root, "24m") else {
        eprintln!("disk-full test SKIPPED: cannot mount a tmpfs here (needs root)");
        return;
    };
    let data_dir = mount.0.join("node");
    // Ballast, freed later to let the store reopen.
    std::fs::write(mount.0.join("ballast"), vec![0u8; 4 << 20]).unwrap();

    let options = StorageOptions {
        write_buffer_bytes: 1 << 20,
        block_cache_bytes: 1 << 20,
        ..StorageOptions::default()
    };
    let mut acknowledged = 0u64;
    let failure;
    {
        let node = NodeStorage::open(&data_dir, options.clone()).unwrap();
        let mut store = node.log_store(1);
        let mut index = 1u64;
        failure = loop {
            assert!(index < 1_000_000, "the disk never filled");
            let (tx, rx) = TenureRaft::oneshot();
            if let Err(err) = store
                .append([bulky_entry(index)], IOFlushed::signal(tx))
                .await
            {
                break err;
            }
            match tokio::time::timeout(Duration::from_secs(30), rx)
                .await
                .unwrap()
                .unwrap()
            {
                Ok(()) => acknowledged = index,
                Err(err) => break err,
            }
            index += 1;
        };
        let typed = StoreError::from_io(&failure);
        assert!(
            matches!(
                typed,
                Some(StoreError::Io { .. } | StoreError::GroupStopped { .. })
            ),
            "expected a typed I/O error, got {failure}"
        );
        // The store refuses further writes.
        let (tx, _rx) = TenureRaft::oneshot();
        let refused = store
            .append([bulky_entry(index + 1)], IOFlushed::signal(tx))
            .await;
        assert!(refused.is_err(), "writes must stop after the failure");
        assert!(!node.stopped_groups().is_empty() || node.node_failure().is_some());
    }
    eprintln!("disk full after {acknowledged} acknowledged appends: {failure}");
    assert!(
        acknowledged > 10,
        "the disk filled too early to say anything"
    );

    std::fs::remove_file(mount.0.join("ballast")).unwrap();
    let node = NodeStorage::open(&data_dir, options).expect("the store reopens once space is free");
    let entries = node
        .log_store(1)
        .try_get_log_entries(1..=acknowledged)
        .await
        .unwrap();
    assert_eq!(
        entries.len() as u64,
        acknowledged,
        "acknowledged entries lost"
    );
    for (entry, index) in entries.iter().zip(1..) {
        assert_eq!(entry.index(), index);
        assert_eq!(entry, &bulky_entry(index));
    }
}
