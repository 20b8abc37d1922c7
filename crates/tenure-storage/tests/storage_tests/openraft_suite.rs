//! openraft's own storage conformance suite, run against tenure-storage's RocksDB store.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use openraft::StorageError;
use openraft::testing::log::{StoreBuilder, Suite};
use openraft::type_config::TypeConfigExt;
use tempfile::TempDir;
use tenure_core::StateOptions;
use tenure_storage::{
    GroupLogStore, GroupStateMachine, MemoryDisk, NodeStorage, StorageOptions, TenureRaft,
};

struct RocksBuilder;

impl StoreBuilder<TenureRaft, GroupLogStore, GroupStateMachine, (NodeStorage, TempDir)>
    for RocksBuilder
{
    async fn build(
        &self,
    ) -> Result<((NodeStorage, TempDir), GroupLogStore, GroupStateMachine), StorageError<TenureRaft>>
    {
        let dir =
            TempDir::new().map_err(|e| StorageError::write(TenureRaft::err_from_error(&e)))?;
        let node = NodeStorage::open(dir.path(), StorageOptions::default())
            .map_err(|e| StorageError::write(TenureRaft::err_from_error(&e)))?;
        // A non-zero group id, with a neighbour's data around it, checks the key prefixing.
        let neighbour = node.log_store(6);
        drop(neighbour);
        let log = node.log_store(7);
        let machine = node
            .state_machine(7, StateOptions::default())
            .map_err(|e| StorageError::read(TenureRaft::err_from_error(&e)))?;
        Ok(((node, dir), log, machine))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite_passes_against_the_rocksdb_store() {
    Suite::test_all(RocksBuilder).await.unwrap();
}

/// The same store on a memory disk (what the deterministic simulation runs on).
struct MemoryBuilder;

impl StoreBuilder<TenureRaft, GroupLogStore, GroupStateMachine, (NodeStorage, TempDir)>
    for MemoryBuilder
{
    async fn build(
        &self,
    ) -> Result<((NodeStorage, TempDir), GroupLogStore, GroupStateMachine), StorageError<TenureRaft>>
    {
        let dir =
            TempDir::new().map_err(|e| StorageError::write(TenureRaft::err_from_error(&e)))?;
        let node = NodeStorage::open_in_memory(
            dir.path(),
            MemoryDisk::new(7, 50),
            StorageOptions::default(),
        )
        .map_err(|e| StorageError::write(TenureRaft::err_from_error(&e)))?;
        let log = node.log_store(7);
        let machine = node
            .state_machine(7, StateOptions::default())
            .map_err(|e| StorageError::read(TenureRaft::err_from_error(&e)))?;
        Ok(((node, dir), log, machine))
    }
}

#[tokio::test(flavor = "current_thread")]
async fn openraft_storage_suite_passes_against_the_memory_disk() {
    Suite::test_all(MemoryBuilder).await.unwrap();
}
