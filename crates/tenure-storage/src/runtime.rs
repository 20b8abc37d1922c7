//! The async runtime of every tenure Raft group: openraft's tokio runtime, except that its random
//! numbers (election timeouts, the first tick) can come from a seed.
//!
//! Outside a simulation nothing changes: [`TenureRuntime::thread_rng`] is the operating system's
//! generator, as with openraft's `TokioRuntime`. A deterministic simulation calls
//! [`seed_raft_randomness`] on its thread before it starts the cluster; from then on every group
//! on that thread draws from one seeded stream, which replays exactly because the simulation's
//! scheduling does.
//!
//! Must not depend on: the storage engine, the network.

use std::cell::RefCell;
use std::future::Future;
use std::time::Duration;

use openraft::OptionalSend;
use openraft::rt::AsyncRuntime;
use rand010::rngs::SmallRng;
use rand010::{Rng as _, SeedableRng as _};

#[allow(deprecated)]
type Tokio = openraft::impls::TokioRuntime;

thread_local! {
    static SEEDED: RefCell<Option<SmallRng>> = const { RefCell::new(None) };
}

/// Makes every group on this thread draw its random numbers from `seed` (a simulation, before it
/// starts its cluster), or from the operating system again (`None`).
pub fn seed_raft_randomness(seed: Option<u64>) {
    SEEDED.with(|seeded| *seeded.borrow_mut() = seed.map(SmallRng::seed_from_u64));
}

/// openraft's tokio runtime with seedable randomness (see the module docs).
#[derive(Debug)]
pub struct TenureRuntime(Tokio);

impl AsyncRuntime for TenureRuntime {
    type JoinError = <Tokio as AsyncRuntime>::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = <Tokio as AsyncRuntime>::JoinHandle<T>;
    type Sleep = <Tokio as AsyncRuntime>::Sleep;
    type Instant = <Tokio as AsyncRuntime>::Instant;
    type TimeoutError = <Tokio as AsyncRuntime>::TimeoutError;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = <Tokio as AsyncRuntime>::Timeout<R, T>;
    type ThreadLocalRng = SmallRng;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        Tokio::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        Tokio::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        Tokio::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        Tokio::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        Tokio::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        Tokio::is_panic(join_error)
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        SEEDED.with(|seeded| match seeded.borrow_mut().as_mut() {
            Some(stream) => SmallRng::seed_from_u64(stream.next_u64()),
            None => SmallRng::from_rng(&mut rand010::rng()),
        })
    }

    type Mpsc = <Tokio as AsyncRuntime>::Mpsc;
    type Watch = <Tokio as AsyncRuntime>::Watch;
    type Oneshot = <Tokio as AsyncRuntime>::Oneshot;
    type Mutex<T: OptionalSend + 'static> = <Tokio as AsyncRuntime>::Mutex<T>;

    fn new(threads: usize) -> Self {
        TenureRuntime(Tokio::new(threads))
    }

    fn block_on<F, T>(&mut self, future: F) -> T
    where
        F: Future<Output = T>,
    {
        self.0.block_on(future)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draws() -> Vec<u64> {
        (0..4)
            .map(|_| TenureRuntime::thread_rng().next_u64())
            .collect()
    }

    #[test]
    fn a_seed_replays_the_same_draws_and_none_goes_back_to_the_system() {
        seed_raft_randomness(Some(42));
        let first = draws();
        seed_raft_randomness(Some(42));
        assert_eq!(draws(), first);
        seed_raft_randomness(Some(43));
        assert_ne!(draws(), first);
        seed_raft_randomness(None);
        assert_ne!(draws(), first);
    }
}
