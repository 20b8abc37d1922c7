//! Integration tests of the RocksDB storage: behaviour, openraft's storage suite, crash safety, a
//! full disk and the pinned disk formats. One test binary for the crate, so its dependencies
//! (RocksDB above all) are linked once; one module per concern.

mod behaviour;
mod crash;
mod disk_full;
mod golden;
mod openraft_suite;
