//! Behaviour of the multi-group store: isolation by group prefix, shared flushing, durable votes,
//! typed corruption errors that stop only the affected group, and snapshots that survive reopen.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use openraft::RaftLogReader;
use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, RaftLogStorage, RaftSnapshotBuilder, RaftStateMachine};
use openraft::testing::log_id;
use openraft::type_config::TypeConfigExt;
use tempfile::TempDir;
use tenure_core::{
    AcquireRequest, Command, Entry, LeaseOp, LeaseStateMachine, ResourceKey, StateOptions,
};
use tenure_storage::{
    CF_LOG, LogEntry, NodeStorage, StorageOptions, StoreError, TenureRaft, codec,
};

fn entry(index: u64, log_time_ms: u64, command: Command) -> LogEntry {
    LogEntry::new_normal(
        log_id::<TenureRaft>(1, 0, index),
        Entry {
            log_time_ms,
            command,
        },
    )
}

fn acquire(resource: &str, request: &str) -> Command {
    Command::Lease(LeaseOp::Acquire(AcquireRequest {
        key: ResourceKey::new("acme", resource),
        holder_id: "holder".to_owned(),
        ttl_ms: 60_000,
        request_id: request.to_owned(),
    }))
}

async fn append_durably(store: &mut tenure_storage::GroupLogStore, entries: Vec<LogEntry>) {
    let (tx, rx) = TenureRaft::oneshot();
    store.append(entries, IOFlushed::signal(tx)).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), rx)
        .await
        .expect("flush within 10 s")
        .expect("flusher alive")
        .expect("flush succeeded");
}

fn expire_entries(range: std::ops::Range<u64>) -> Vec<LogEntry> {
    range
        .map(|i| entry(i, i, Command::Expire { leases_max: 1 }))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_share_one_database_but_never_see_each_others_entries() {
    let dir = TempDir::new().unwrap();
    let node = NodeStorage::open(dir.path(), StorageOptions::default()).unwrap();
    let mut one = node.log_store(1);
    let mut two = node.log_store(2);
    append_durably(&mut one, expire_entries(1..11)).await;
    append_durably(&mut two, expire_entries(1..21)).await;

    one.truncate_after(Some(log_id::<TenureRaft>(1, 0, 4)))
        .await
        .unwrap();
    two.purge(log_id::<TenureRaft>(1, 0, 5)).await.unwrap();

    let state_one = one.get_log_state().await.unwrap();
    assert_eq!(state_one.last_log_id.unwrap().index(), 4);
    assert!(state_one.last_purged_log_id.is_none());
    let state_two = two.get_log_state().await.unwrap();
    assert_eq!(state_two.last_log_id.unwrap().index(), 20);
    assert_eq!(state_two.last_purged_log_id.unwrap().index(), 5);

    let left_one = one.try_get_log_entries(0..100).await.unwrap();
    assert_eq!(
        left_one.iter().map(|e| e.index()).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    let left_two = two.try_get_log_entries(0..100).await.unwrap();
    assert_eq!(left_two.first().unwrap().index(), 6);
    assert_eq!(left_two.len(), 15);
    assert!(
        node.log_store(3)
            .get_log_state()
            .await
            .unwrap()
            .last_log_id
            .is_none()
    );
}

/// Reads of one group stop at its own keys on both engines, whatever its neighbours hold: a
/// neighbour whose whole log was purged (range-deleted), one with a purged prefix, none at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_stay_inside_their_group_beside_purged_neighbours_on_both_engines() {
    for engine in ["rocksdb", "memory"] {
        let dir = TempDir::new().unwrap();
        let node = if engine == "rocksdb" {
            NodeStorage::open(dir.path(), StorageOptions::default()).unwrap()
        } else {
            let disk = tenure_storage::MemoryDisk::new(7, 0);
            NodeStorage::open_in_memory(dir.path(), disk, StorageOptions::default()).unwrap()
        };
        let mut stores: Vec<_> = (0..5).map(|group| node.log_store(group)).collect();
        // Group 1: entries 1..=4. Group 2: 1..=30, all purged. Group 3: 1..=30, purged to 20.
        // Group 4: nothing. Groups 0 and 4 border the others without any entry.
        append_durably(&mut stores[1], expire_entries(1..5)).await;
        append_durably(&mut stores[2], expire_entries(1..31)).await;
        append_durably(&mut stores[3], expire_entries(1..31)).await;
        stores[2]
            .purge(log_id::<TenureRaft>(1, 0, 30))
            .await
            .unwrap();
        stores[3]
            .purge(log_id::<TenureRaft>(1, 0, 20))
            .await
            .unwrap();

        let indexes =
            |entries: Vec<LogEntry>| entries.iter().map(|e| e.index()).collect::<Vec<_>>();
        assert_eq!(
            indexes(stores[1].read_range(0, 100).unwrap()),
            [1, 2, 3, 4],
            "{engine}"
        );
        assert_eq!(
            indexes(stores[1].read_range(2, 4).unwrap()),
            [2, 3],
            "{engine}"
        );
        // openraft's unbounded range.
        assert_eq!(
            indexes(stores[1].read_range(0, u64::MAX).unwrap()),
            [1, 2, 3, 4],
            "{engine}"
        );
        assert!(stores[2].read_range(0, 100).unwrap().is_empty(), "{engine}");
        assert_eq!(
            indexes(stores[3].read_range(0, 100).unwrap()),
            (21..31).collect::<Vec<_>>(),
            "{engine}"
        );
        assert_eq!(
            indexes(stores[3].read_range(25, 27).unwrap()),
            [25, 26],
            "{engine}"
        );
        assert!(stores[3].read_range(40, 50).unwrap().is_empty(), "{engine}");
        let edge = |entry: Option<LogEntry>| entry.map(|e| e.index());
        for (group, first, last) in [
            (0, None, None),
            (1, Some(1), Some(4)),
            (2, None, None),
            (3, Some(21), Some(30)),
            (4, None, None),
        ] {
            let store = &stores[group];
            assert_eq!(
                edge(store.first_entry().unwrap()),
                first,
                "{engine} group {group}"
            );
            assert_eq!(
                edge(store.last_entry().unwrap()),
                last,
                "{engine} group {group}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_from_many_groups_complete_through_the_shared_flusher() {
    let dir = TempDir::new().unwrap();
    let node = NodeStorage::open(dir.path(), StorageOptions::default()).unwrap();
    let mut waits = Vec::new();
    for round in 0..10u64 {
        for group in 0..64u32 {
            let mut store = node.log_store(group);
            let (tx, rx) = TenureRaft::oneshot();
            store
                .append(expire_entries(round + 1..round + 2), IOFlushed::signal(tx))
                .await
                .unwrap();
            waits.push(rx);
        }
    }
    for rx in waits {
        tokio::time::timeout(Duration::from_secs(20), rx)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
    let stats = node.stats();
    assert_eq!(stats.appends, 640);
    assert_eq!(stats.callbacks_completed, 640);
    assert!(stats.fsyncs >= 1 && stats.fsyncs <= 640, "{stats:?}");
    eprintln!(
        "640 appends from 64 groups completed with {} WAL syncs",
        stats.fsyncs
    );
    for group in 0..64u32 {
        let entries = node.log_store(group).try_get_log_entries(..).await.unwrap();
        assert_eq!(entries.len(), 10, "group {group}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn votes_and_logs_survive_reopening_the_store() {
    let dir = TempDir::new().unwrap();
    let vote =
        openraft::impls::Vote::<openraft::impls::leader_id_adv::LeaderId<u64, u64>>::new(3, 2);
    {
        let node = NodeStorage::open(dir.path(), StorageOptions::default()).unwrap();
        let mut store = node.log_store(9);
        store.save_vote(&vote).await.unwrap();
        append_durably(&mut store, expire_entries(1..6)).await;
        store
            .save_committed(Some(log_id::<TenureRaft>(1, 0, 5)))
            .await
            .unwrap();
    }
    let node = NodeStorage::open(dir.path(), StorageOptions::default()).unwrap();
    let mut store = node.log_store(9);
    assert_eq!(store.read_vote().await.unwrap(), Some(vote));
    assert_eq!(store.read_committed().await.unwrap().unwrap().index(), 5);
    assert_eq!(store.try_get_log_entries(..).await.unwrap().len(), 5);
}

fn corrupt_value(dir: &std::path::Path, key: &[u8]) {
    let mut options = rocksdb::Options::default();
    options.create_if_missing(false);
    let db = rocksdb::DB::open_cf(&options, dir.join("db"), ["log", "meta", "state"]).unwrap();
    let cf = db.cf_handle(CF_LOG).unwrap();
    let mut value = db.get_cf(cf, key).unwrap().expect("value present");
    let last = value.len() - 1;
    value[last] ^= 0x5a;
    db.put_cf(cf, key, value).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_log_entry_is_a_typed_error_naming_group_and_index_and_stops_only_that_group() {
    let dir = TempDir::new().unwrap();
    {
        let node = NodeStorage::open(dir.path(), StorageOptions::default()).unwrap();
        append_durably(&mut node.log_store(3), expire_entries(1..6)).await;
        append_durably(&mut node.log_store(4), expire_entries(1..6)).await;
    }
    corrupt_value(dir.path(), &codec::log_key(3, 2));

    let node = NodeStorage::open(dir.path(), StorageOptions::default()).unwrap();
    let mut three = node.log_store(3);
    let err = three.try_get_log_entries(1..6).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
    match StoreError::from_io(&err) {
        Some(StoreError::Corrupt { group, what, .. }) => {
            assert_eq!(*group, 3);
            assert_eq!(what, "log entry 2");
        }
        other => panic!("expected corruption, got {other:?}"),
    }
    // The group has stopped: even writes are refused now.
    let (tx, _rx) = TenureRaft::oneshot();
    let refused = three
        .append(expire_entries(6..7), IOFlushed::signal(tx))
        .await
        .unwrap_err();
    assert!(matches!(
        StoreError::from_io(&refused),
        Some(StoreError::GroupStopped { group: 3, .. })
    ));
    assert_eq!(node.stopped_groups().len(), 1);
    // Its neighbour is untouched.
    let mut four = node.log_store(4);
    assert_eq!(four.try_get_log_entries(..).await.unwrap().len(), 5);
    append_durably(&mut four, expire_entries(6..7)).await;
}

async fn apply_all(machine: &mut tenure_storage::GroupStateMachine, entries: Vec<LogEntry>) {
    let stream = futures_util::stream::iter(entries.into_iter().map(|e| Ok((e, None))));
    machine.apply(stream).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_machine_restores_its_snapshot_after_reopen() {
    let dir = TempDir::new().unwrap();
    let (expected, last_applied) = {
        let node = NodeStorage::open(dir.path(), StorageOptions::default()).unwrap();
        let mut machine = node.state_machine(5, StateOptions::default()).unwrap();
        let entries = (1..=50)
            .map(|i| entry(i, 1_000 + i, acquire(&format!("r{i}"), "q")))
            .collect();
        apply_all(&mut machine, entries).await;
        let mut builder = machine.get_snapshot_builder().await;
        let snapshot = builder.build_snapshot().await.unwrap();
        assert_eq!(snapshot.meta.last_log_id.as_ref().unwrap().index(), 50);
        let expected = machine.with_leases(LeaseStateMachine::snapshot_to_vec);
        (expected, snapshot.meta.last_log_id)
    };
    let node = NodeStorage::open(dir.path(), StorageOptions::default()).unwrap();
    let mut machine = node
        .state_machine(
            5,
            StateOptions {
                hash_seed: 77,
                ..StateOptions::default()
            },
        )
        .unwrap();
    assert_eq!(
        machine.with_leases(LeaseStateMachine::snapshot_to_vec),
        expected
    );
    let (applied, _) = machine.applied_state().await.unwrap();
    assert_eq!(applied, last_applied);
    assert_eq!(machine.with_leases(|l| l.stats().active_leases), 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_snapshot_file_stops_the_group_at_open_with_a_typed_error() {
    let dir = TempDir::new().unwrap();
    {
        let node = NodeStorage::open(dir.path(), StorageOptions::default()).unwrap();
        let mut machine = node.state_machine(8, StateOptions::default()).unwrap();
        apply_all(&mut machine, vec![entry(1, 5, acquire("db", "q"))]).await;
        machine
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
    }
    let snap_dir = dir.path().join("snapshots/group-00008");
    let file = std::fs::read_dir(&snap_dir)
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().ends_with(".snap"))
        .unwrap()
        .path();
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[20] ^= 0xff;
    std::fs::write(&file, bytes).unwrap();

    let node = NodeStorage::open(dir.path(), StorageOptions::default()).unwrap();
    let err = node.state_machine(8, StateOptions::default()).unwrap_err();
    assert!(
        matches!(err, StoreError::Snapshot { group: 8, .. }),
        "{err}"
    );
    assert!(err.is_corruption());
    assert_eq!(node.stopped_groups().len(), 1);
    assert!(node.state_machine(9, StateOptions::default()).is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_installed_snapshot_replaces_the_state_and_survives_reopen() {
    let source_dir = TempDir::new().unwrap();
    let target_dir = TempDir::new().unwrap();
    let source = NodeStorage::open(source_dir.path(), StorageOptions::default()).unwrap();
    let mut leader = source.state_machine(2, StateOptions::default()).unwrap();
    let entries = (1..=20)
        .map(|i| entry(i, 100 + i, acquire(&format!("r{i}"), "q")))
        .collect();
    apply_all(&mut leader, entries).await;
    let snapshot = leader
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    let expected = leader.with_leases(LeaseStateMachine::snapshot_to_vec);

    {
        let target = NodeStorage::open(target_dir.path(), StorageOptions::default()).unwrap();
        let mut follower = target.state_machine(2, StateOptions::default()).unwrap();
        follower
            .install_snapshot(&snapshot.meta, snapshot.snapshot)
            .await
            .unwrap();
        assert_eq!(
            follower.with_leases(LeaseStateMachine::snapshot_to_vec),
            expected
        );
        let current = follower.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(current.meta.last_log_id, snapshot.meta.last_log_id);
    }
    let target = NodeStorage::open(target_dir.path(), StorageOptions::default()).unwrap();
    let follower = target.state_machine(2, StateOptions::default()).unwrap();
    assert_eq!(
        follower.with_leases(LeaseStateMachine::snapshot_to_vec),
        expected
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hole_inside_a_log_is_a_typed_error_not_a_short_read() {
    let dir = TempDir::new().unwrap();
    {
        let node = NodeStorage::open(dir.path(), StorageOptions::default()).unwrap();
        append_durably(&mut node.log_store(3), expire_entries(1..6)).await;
    }
    {
        let mut options = rocksdb::Options::default();
        options.create_if_missing(false);
        let db = rocksdb::DB::open_cf(&options, dir.path().join("db"), ["log", "meta", "state"])
            .unwrap();
        db.delete_cf(db.cf_handle(CF_LOG).unwrap(), codec::log_key(3, 3))
            .unwrap();
    }
    let node = NodeStorage::open(dir.path(), StorageOptions::default()).unwrap();
    let err = node
        .log_store(3)
        .try_get_log_entries(1..6)
        .await
        .unwrap_err();
    assert!(
        matches!(
            StoreError::from_io(&err),
            Some(StoreError::Hole {
                group: 3,
                missing: 3
            })
        ),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_injected_sync_delay_holds_every_durable_append_back_and_can_be_lifted() {
    let dir = TempDir::new().unwrap();
    let options = StorageOptions::default();
    let delay_us = options.injected_sync_delay_us.clone();
    let node = NodeStorage::open(dir.path(), options).unwrap();
    let mut store = node.log_store(1);
    delay_us.store(150_000, std::sync::atomic::Ordering::Relaxed);
    let started = std::time::Instant::now();
    append_durably(&mut store, expire_entries(1..4)).await;
    // A slow disk: the append is acknowledged only after the injected delay.
    assert!(
        started.elapsed() >= Duration::from_millis(150),
        "acknowledged after {:?}",
        started.elapsed()
    );
    delay_us.store(0, std::sync::atomic::Ordering::Relaxed);
    append_durably(&mut store, expire_entries(4..6)).await;
    let read = store.try_get_log_entries(1..6).await.unwrap();
    assert_eq!(read.len(), 5, "nothing appended under the delay was lost");
}

#[tokio::test(flavor = "current_thread")]
async fn a_memory_disk_keeps_acknowledged_appends_and_votes_across_a_crash_and_loses_only_unsynced_ones()
 {
    let dir = TempDir::new().unwrap();
    let disk = tenure_storage::MemoryDisk::new(3, 100);
    let vote = openraft::Vote::new(4, 2);
    {
        let node = NodeStorage::open_in_memory(dir.path(), disk.clone(), StorageOptions::default())
            .unwrap();
        let mut store = node.log_store(1);
        store.save_vote(&vote).await.unwrap();
        append_durably(&mut store, expire_entries(1..6)).await;
        // Written but never flushed: the callback is dropped, nothing acknowledges these.
        store
            .append(expire_entries(6..9), IOFlushed::noop())
            .await
            .unwrap();
        assert_eq!(store.try_get_log_entries(1..9).await.unwrap().len(), 8);
    }
    let loss = disk.crash();
    assert_eq!(loss.kept_batches + loss.lost_batches, 1, "{loss:?}");
    let node =
        NodeStorage::open_in_memory(dir.path(), disk.clone(), StorageOptions::default()).unwrap();
    let mut store = node.log_store(1);
    assert_eq!(
        store.read_vote().await.unwrap(),
        Some(vote),
        "a saved vote is synced"
    );
    let survived = store.try_get_log_entries(1..9).await.unwrap();
    // Every acknowledged append survives; the unacknowledged batch survives whole or not at all.
    assert_eq!(survived.len(), 5 + 3 * loss.kept_batches, "{loss:?}");
}

/// The write-ahead log files of a closed store, largest first.
fn wal_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir.join("db"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
        .map(|e| (e.metadata().unwrap().len(), e.path()))
        .collect();
    files.sort();
    files.into_iter().rev().map(|(_, path)| path).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mid_wal_corruption_refuses_to_open_instead_of_dropping_synced_writes() {
    let dir = TempDir::new().unwrap();
    let vote = openraft::Vote::new(5, 2);
    {
        let node = NodeStorage::open(dir.path(), StorageOptions::default()).unwrap();
        let mut store = node.log_store(6);
        // One WAL record per append, every one synced and acknowledged, then a synced vote.
        for index in 1..=40 {
            append_durably(&mut store, expire_entries(index..index + 1)).await;
        }
        store.save_vote(&vote).await.unwrap();
    }
    let wal = wal_files(dir.path())
        .into_iter()
        .next()
        .expect("a WAL file");
    let mut bytes = std::fs::read(&wal).unwrap();
    let middle = bytes.len() / 2;
    for byte in &mut bytes[middle..middle + 8] {
        *byte ^= 0xff;
    }
    std::fs::write(&wal, &bytes).unwrap();

    match NodeStorage::open(dir.path(), StorageOptions::default()) {
        Err(err) => {
            eprintln!("refused: {err}");
            assert!(
                matches!(err, StoreError::CorruptStore { .. }),
                "expected the typed corruption error, got {err}"
            );
            assert!(err.is_corruption());
            assert!(err.to_string().contains("ops/runbooks/StorageCorrupt.md"));
        }
        Ok(node) => {
            let mut store = node.log_store(6);
            let survived = store.try_get_log_entries(1..=40).await.unwrap().len();
            let vote = store.read_vote().await.unwrap();
            panic!(
                "opened a store with a corrupt WAL: {survived} of 40 synced entries survived, vote {vote:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_wal_tail_from_a_crash_still_opens_with_every_synced_write() {
    let dir = TempDir::new().unwrap();
    let vote = openraft::Vote::new(5, 2);
    {
        let node = NodeStorage::open(dir.path(), StorageOptions::default()).unwrap();
        let mut store = node.log_store(6);
        for index in 1..=20 {
            append_durably(&mut store, expire_entries(index..index + 1)).await;
        }
        store.save_vote(&vote).await.unwrap();
        // The last record: never acknowledged, torn by the "crash" below.
        store
            .append(expire_entries(21..22), IOFlushed::noop())
            .await
            .unwrap();
    }
    let wal = wal_files(dir.path())
        .into_iter()
        .next()
        .expect("a WAL file");
    let len = std::fs::metadata(&wal).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&wal)
        .unwrap()
        .set_len(len - 5)
        .unwrap();

    let node = NodeStorage::open(dir.path(), StorageOptions::default())
        .expect("an incomplete last record is what a crash leaves: the store opens");
    let mut store = node.log_store(6);
    assert_eq!(store.try_get_log_entries(1..=21).await.unwrap().len(), 20);
    assert_eq!(store.read_vote().await.unwrap(), Some(vote));
}

/// The replica record survives reopening; dropping a replica deletes its log, marks, state and
/// snapshot files but keeps its vote, and leaves every other group alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_replica_loses_its_data_but_keeps_its_vote_and_the_record_survives() {
    let dir = TempDir::new().unwrap();
    let vote =
        openraft::impls::Vote::<openraft::impls::leader_id_adv::LeaderId<u64, u64>>::new(4, 1);
    {
        let node = NodeStorage::open(dir.path(), StorageOptions::default()).unwrap();
        assert_eq!(node.recorded_replicas().unwrap(), None);
        node.record_replicas(&[2, 3].into_iter().collect()).unwrap();
        for group in [2, 3] {
            let mut store = node.log_store(group);
            store.save_vote(&vote).await.unwrap();
            append_durably(&mut store, expire_entries(1..6)).await;
            store
                .save_committed(Some(log_id::<TenureRaft>(1, 0, 5)))
                .await
                .unwrap();
            let mut machine = node.state_machine(group, StateOptions::default()).unwrap();
            apply_all(&mut machine, vec![entry(1, 10, acquire("r", "q"))]).await;
            machine
                .get_snapshot_builder()
                .await
                .build_snapshot()
                .await
                .unwrap();
        }
        let snapshots = dir.path().join("snapshots").join("group-00002");
        assert!(snapshots.read_dir().unwrap().next().is_some());
        node.delete_replica(2, &[3].into_iter().collect()).unwrap();
        assert!(!snapshots.exists());
        assert!(node.delete_replica(3, &[3].into_iter().collect()).is_err());
    }
    let node = NodeStorage::open(dir.path(), StorageOptions::default()).unwrap();
    assert_eq!(
        node.recorded_replicas().unwrap(),
        Some([3].into_iter().collect())
    );
    let mut dropped = node.log_store(2);
    assert_eq!(dropped.read_vote().await.unwrap(), Some(vote));
    assert_eq!(dropped.read_committed().await.unwrap(), None);
    assert!(dropped.try_get_log_entries(..).await.unwrap().is_empty());
    let mut machine = node.state_machine(2, StateOptions::default()).unwrap();
    assert_eq!(machine.applied_state().await.unwrap().0, None);
    let mut kept = node.log_store(3);
    assert_eq!(kept.try_get_log_entries(..).await.unwrap().len(), 5);
    let mut machine = node.state_machine(3, StateOptions::default()).unwrap();
    assert!(machine.applied_state().await.unwrap().0.is_some());
}
