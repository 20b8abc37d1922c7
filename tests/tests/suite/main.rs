//! The workspace test suite: one binary, one module per concern.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

mod architecture;
mod checker;
mod nemesis;
mod sim;

/// One heavy run at a time (a cluster of node processes, or a simulation): they need both cores,
/// and the fault runs' timing must not suffer from a simulation beside them.
static RUNS: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub(crate) fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    RUNS.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
